"""Pair two arms that ran under different comparison names, seed by seed.

    python benchmarks/learning/pair_archives.py af-slow:exgrpo af-slow-q:no_question_selection

Each side is NAME:ARM, an arm of the seed archive results/arith_compare_<NAME>_seeds.json. The two
archives must share the preset, the overrides and the starting model, and the runs must be repeatable:
the baseline arm (`--baseline`, on_policy) present in both must have the same held-out results in every
shared seed, which shows that the seed gave both archives the same data order and sampling. Prints the
paired differences (second minus first) of the final held-out pass@1 and the area under the held-out
curve, mean with 95% t and bootstrap intervals, t and sign-flip p, and writes
results/pair_<name>_<arm>__<name>_<arm>.json.

Holm's correction over tests from several archives (a family of headline comparisons):

    python benchmarks/learning/pair_archives.py --family af-main,af-ablations,af-slow
    python benchmarks/learning/pair_archives.py af-slow:exgrpo af-slow-q:no_question_selection --family af-main,af-slow

The family is every arm's final and area comparison against the baseline in each named archive (and the
pair's two, when a pair is given); each p is corrected over the whole family, and the verdicts use that p.
Writes results/holm_family_<names>.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.bench_record import RESULTS, save_result  # noqa: E402
from benchmarks.learning import seed_archive  # noqa: E402

from exgrpo_core.evaluation import stats  # noqa: E402
from flows.compare import stats as compare_stats  # noqa: E402

METRICS = {"heldout_avg": "final held-out pass@1", "heldout_auc": "area under the held-out curve"}
CHECKED = ("heldout_avg", "heldout_auc", "heldout_start")


class PairError(ValueError):
    """The two archives cannot be paired."""


def parse_side(text: str) -> tuple[str, str]:
    name, sep, arm = text.rpartition(":")
    if not sep or not name or not arm:
        raise PairError(f"{text!r}: expected NAME:ARM, e.g. af-slow:exgrpo")
    return name, arm


def rows_by_seed(archive: dict, arm: str) -> dict[int, dict]:
    out = {int(s): r["row"] for s, entry in archive["seeds"].items() for r in entry["results"]
           if r["row"]["arm"] == arm}
    if not out:
        raise PairError(f"archive {archive['name']!r} has no arm {arm!r} (arms: {archive['fingerprint']['arms']})")
    return out


def pair(a: dict, arm_a: str, b: dict, arm_b: str, baseline: str = "on_policy") -> dict:
    """Per-seed differences arm_b - arm_a and their summaries, after checking the archives agree."""
    fa, fb = a["fingerprint"], b["fingerprint"]
    for key in ("preset", "overrides", "start_model"):
        if fa.get(key) != fb.get(key):
            raise PairError(f"{key} differs: {a['name']} has {fa.get(key)!r}, {b['name']} has {fb.get(key)!r}")
    ra, rb = rows_by_seed(a, arm_a), rows_by_seed(b, arm_b)
    seeds = sorted(set(ra) & set(rb))
    if len(seeds) < 2:
        raise PairError(f"only {len(seeds)} shared seed(s) between {a['name']}:{arm_a} and {b['name']}:{arm_b}")
    base_a, base_b = rows_by_seed(a, baseline), rows_by_seed(b, baseline)
    for s in seeds:
        if s not in base_a or s not in base_b:
            raise PairError(f"seed {s}: the baseline arm {baseline!r} is missing from one archive")
        diff = [k for k in CHECKED if base_a[s].get(k) != base_b[s].get(k)]
        if diff:
            raise PairError(f"seed {s}: {baseline} differs between the archives in {diff}: the runs did not repeat, "
                            "so the seeds are not paired")
    out = {"first": f"{a['name']}:{arm_a}", "second": f"{b['name']}:{arm_b}", "baseline_checked": baseline,
           "seeds": seeds, "metrics": {}}
    for key in METRICS:
        diffs = stats.paired_differences({s: rb[s][key] for s in seeds}, {s: ra[s][key] for s in seeds})
        first, second = stats.mean([ra[s][key] for s in diffs]), stats.mean([rb[s][key] for s in diffs])
        out["metrics"][key] = {"first_mean": first, "second_mean": second, "arm_mean": second, "baseline_mean": first,
                               "paired_seeds": len(seeds), "per_seed": diffs,
                               **stats.summarise_differences(list(diffs.values()))}
    holm = stats.holm({k: m["p"] for k, m in out["metrics"].items()})
    for k, m in out["metrics"].items():
        m["p_holm"] = holm[k]
        m["final_verdict"] = compare_stats.final_verdict(m)
    return out


def family(names: list[str], folder: Path, baseline: str = "on_policy", pair_result: dict | None = None) -> dict:
    """{comparison: {arm: {metric: summary}}} for every archive in `names` (each arm against `baseline`),
    plus the pair's metrics, with Holm's correction over all their final and area tests together."""
    if len(set(names)) != len(names):
        raise PairError(f"--family names an archive twice: {names}")
    archives = {n: seed_archive.load_existing(n, folder) for n in names}  # every name checked before any work
    tables = {}
    for n, archive in archives.items():
        rows = [r["row"] for r in seed_archive.results(archive)]
        if baseline not in {r["arm"] for r in rows}:
            raise PairError(f"archive {n!r} has no {baseline!r} arm to compare against")
        tables[n] = compare_stats.paired_stats(rows, baseline)
    if pair_result:
        tables[f"pair vs {pair_result['first']}"] = {pair_result["second"]: pair_result["metrics"]}
    compare_stats.holm_across(tables)
    return tables


def family_table(tables: dict) -> str:
    size = max((s.get("family_size", 0) for t in tables.values() for m in t.values() for s in m.values()), default=0)
    lines = [f"Holm family: {size} tests (final and area of every arm) over {', '.join(tables)}", "",
             *compare_stats.paired_legend(size, "the whole family"), "",
             "| comparison | arm | metric | seeds | arm mean | reference mean | mean diff | 95% t-interval | "
             "95% bootstrap | p (t) | p sign-flip | p Holm (family) | seeds ahead / behind | verdict |",
             "|---|---|---|---:|---:|---:|---:|---|---|---:|---:|---:|---|---|"]
    for name, t in tables.items():
        for arm, metrics in t.items():
            for key in compare_stats.HOLM_METRICS:
                cells = compare_stats.summary_cells(metrics[key], key, "family_verdict", "p_holm_family")
                lines.append(f"| {name} | {arm} | {METRICS[key]} | {cells} |")
    return "\n".join(lines)


def table(result: dict) -> str:
    lines = [f"{result['second']} minus {result['first']}, {len(result['seeds'])} paired seeds "
             f"({result['baseline_checked']} identical in both archives); p Holm over these two metrics", "",
             "| metric | seeds | second | first | mean diff | 95% t-interval | 95% bootstrap | p (t) | p sign-flip | "
             "p Holm | ahead / behind | verdict |", "|---|---:|---:|---:|---:|---|---|---:|---:|---:|---|---|"]
    for key, label in METRICS.items():
        lines.append(f"| {label} | {compare_stats.summary_cells(result['metrics'][key], key)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("first", nargs="?", help="NAME:ARM (the reference)")
    ap.add_argument("second", nargs="?", help="NAME:ARM (differences are second minus first)")
    ap.add_argument("--baseline", default="on_policy", help="arm both archives ran, checked identical per seed")
    ap.add_argument("--family", default="", metavar="NAME1,NAME2,...",
                    help="archives whose final and area tests (every arm against --baseline) form one Holm family")
    ap.add_argument("--folder", default=str(RESULTS), help="where the archives are")
    ap.add_argument("--no-save", action="store_true", help="print only")
    a = ap.parse_args(argv)
    names = [n.strip() for n in a.family.split(",") if n.strip()]
    try:
        if (a.first is None) != (a.second is None) or (a.first is None and not names):
            raise PairError("give two sides NAME:ARM NAME:ARM, or --family NAME1,NAME2,..., or both")
        result = None
        if a.first:
            (na, arm_a), (nb, arm_b) = parse_side(a.first), parse_side(a.second)
            archive_a = seed_archive.load_existing(na, Path(a.folder))
            archive_b = seed_archive.load_existing(nb, Path(a.folder))
            result = pair(archive_a, arm_a, archive_b, arm_b, a.baseline)
        tables = family(names, Path(a.folder), a.baseline, result) if names else None
    except (PairError, seed_archive.ArchiveError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if result:
        print(table(result))
        if not a.no_save:
            save_result(f"pair_{na}_{arm_a}__{nb}_{arm_b}.json", result)
    if tables:
        print(("\n" if result else "") + family_table(tables))
        if not a.no_save:
            save_result(f"holm_family_{'_'.join(names)}.json", {"family": names, "pair": bool(result), "tables": tables})
    return 0


if __name__ == "__main__":
    sys.exit(main())
