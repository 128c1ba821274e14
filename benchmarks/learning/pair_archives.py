"""Pair two arms that ran under different comparison names, seed by seed.

    python benchmarks/learning/pair_archives.py af-slow:exgrpo af-slow-q:no_question_selection

Each side is NAME:ARM, an arm of the seed archive results/arith_compare_<NAME>_seeds.json. The two
archives must share the preset, the overrides and the starting model, and the runs must be repeatable:
the baseline arm (`--baseline`, on_policy) present in both must have the same held-out results in every
shared seed, which shows that the seed gave both archives the same data order and sampling. Prints the
paired differences (second minus first) of the final held-out pass@1 and the area under the held-out
curve, mean with 95% t and bootstrap intervals, and writes results/pair_<name>_<arm>__<name>_<arm>.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.bench_record import RESULTS, save_result  # noqa: E402
from benchmarks.learning import seed_archive  # noqa: E402

from exgrpo_core.evaluation import stats  # noqa: E402

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
        out["metrics"][key] = {"first_mean": stats.mean([ra[s][key] for s in seeds]),
                               "second_mean": stats.mean([rb[s][key] for s in seeds]),
                               "per_seed": diffs, **stats.summarise_differences(list(diffs.values()))}
    return out


def table(result: dict) -> str:
    lines = [f"{result['second']} minus {result['first']}, {len(result['seeds'])} paired seeds "
             f"({result['baseline_checked']} identical in both archives)", "",
             "| metric | first | second | mean diff | 95% t-interval | 95% bootstrap | p | ahead / behind | verdict |",
             "|---|---:|---:|---:|---|---|---:|---|---|"]
    for key, label in METRICS.items():
        m = result["metrics"][key]
        lines.append(f"| {label} | {m['first_mean']:.3f} | {m['second_mean']:.3f} | {m['mean']:+.3f} | "
                     f"{m['t_lo']:+.3f} .. {m['t_hi']:+.3f} | {m['boot_lo']:+.3f} .. {m['boot_hi']:+.3f} | "
                     f"{m['p']:.3f} | {m['ahead']} / {m['behind']} | {m['verdict']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("first", help="NAME:ARM (the reference)")
    ap.add_argument("second", help="NAME:ARM (differences are second minus first)")
    ap.add_argument("--baseline", default="on_policy", help="arm both archives ran, checked identical per seed")
    ap.add_argument("--folder", default=str(RESULTS), help="where the archives are")
    ap.add_argument("--no-save", action="store_true", help="print only")
    a = ap.parse_args(argv)
    try:
        (na, arm_a), (nb, arm_b) = parse_side(a.first), parse_side(a.second)
        archive_a = seed_archive.load_existing(na, Path(a.folder))
        archive_b = seed_archive.load_existing(nb, Path(a.folder))
        result = pair(archive_a, arm_a, archive_b, arm_b, a.baseline)
    except (PairError, seed_archive.ArchiveError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(table(result))
    if not a.no_save:
        save_result(f"pair_{na}_{arm_a}__{nb}_{arm_b}.json", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
