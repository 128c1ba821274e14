"""The comparison's statistics: every arm against on_policy over paired seeds, and where replays came from.

Pure functions over the rows of flows/compare/report.py (no Prefect); the numbers come from
exgrpo_core/evaluation/stats.py. Paired: arm seed s minus on_policy seed s, only seeds both finished.
"""

from __future__ import annotations

import math

from exgrpo_core.evaluation import stats

BASELINE = "on_policy"
# row key -> (label, what a positive difference means)
PAIRED_METRICS = {
    "heldout_avg": ("final held-out pass@1", "higher is better"),
    "heldout_auc": ("area under the held-out curve (mean pass@1 over steps)", "higher is better"),
    "heldout_gain": ("held-out gain over step 0", "higher is better"),
    "responses_to_target": ("responses to reach on-policy's final held-out pass@1", "lower is better; only "
                            "seeds where both arms reached it"),
}
LOWER_IS_BETTER = {"responses_to_target"}  # a negative difference is the arm doing better
# The family Holm's correction runs over: these metrics of every arm in the report (gain repeats the
# final's difference when the arms share their step-0 evaluation; responses-to-target is secondary)
HOLM_METRICS = ("heldout_avg", "heldout_auc")


def paired_stats(rows: list[dict], baseline: str = BASELINE, seed: int = 0) -> dict:
    """{arm: {metric: summary + per-seed differences}} for every arm but the baseline (seed rows only)."""
    per = {}
    for r in rows:
        if r.get("seed") == "mean":
            continue
        if "heldout_gain" not in r:
            r["heldout_gain"] = r.get("heldout_avg", math.nan) - r.get("heldout_start", math.nan)
        per.setdefault(r["arm"], {})[r["seed"]] = r
    if baseline not in per:
        return {}
    out = {}
    for arm, by_seed in per.items():
        if arm == baseline:
            continue
        out[arm] = {}
        for key in PAIRED_METRICS:
            diffs = stats.paired_differences({s: r.get(key, math.nan) for s, r in by_seed.items()},
                                             {s: r.get(key, math.nan) for s, r in per[baseline].items()})
            arm_vals = [by_seed[s].get(key, math.nan) for s in by_seed if s in per[baseline]]
            base_vals = [per[baseline][s].get(key, math.nan) for s in by_seed if s in per[baseline]]
            summary = stats.summarise_differences(list(diffs.values()), seed=seed)
            if key in LOWER_IS_BETTER:
                summary = _lower_is_better(summary)
            out[arm][key] = {**summary,
                             "differences": {str(s): d for s, d in diffs.items()},
                             "arm_mean": stats.mean(arm_vals), "baseline_mean": stats.mean(base_vals),
                             "arm_reached": sum(not math.isnan(v) for v in arm_vals),
                             "paired_seeds": sum(1 for s in by_seed if s in per[baseline])}
    adjusted = stats.holm({(arm, key): out[arm][key]["p"] for arm in out for key in HOLM_METRICS})
    for (arm, key), p in adjusted.items():
        out[arm][key]["p_holm"] = p
        out[arm][key]["holm_family"] = len(adjusted)
    return out


def _lower_is_better(summary: dict) -> dict:
    """A summary of arm - baseline differences where a negative difference is the arm doing better:
    seeds ahead / behind and the verdict swap (the differences and intervals keep their sign)."""
    flip = {"ahead": "behind", "behind": "ahead"}
    return {**summary, "ahead": summary["behind"], "behind": summary["ahead"],
            "verdict": flip.get(summary["verdict"], summary["verdict"])}


COLLAPSE_FRACTION = 0.5  # a run collapsed: final held-out pass@1 below this fraction of its step-0 value


def collapses(rows: list[dict], baseline: str = BASELINE) -> dict:
    """{arm: counts}: runs whose final held-out pass@1 fell below COLLAPSE_FRACTION x their step-0
    value, and against the baseline on paired seeds: discordant pairs and the exact McNemar p."""
    per: dict[str, dict] = {}
    for r in rows:
        start, end = r.get("heldout_start", math.nan), r.get("heldout_avg", math.nan)
        if r.get("seed") != "mean" and not (math.isnan(start) or math.isnan(end)):
            per.setdefault(r["arm"], {})[r["seed"]] = end < COLLAPSE_FRACTION * start
    out = {}
    for arm, by_seed in per.items():
        base = per.get(baseline, {})
        paired = [s for s in by_seed if s in base]
        only_arm = sum(by_seed[s] and not base[s] for s in paired)
        only_base = sum(base[s] and not by_seed[s] for s in paired)
        out[arm] = {"runs": len(by_seed), "collapsed": sum(by_seed.values()), "paired_seeds": len(paired),
                    "only_arm": only_arm, "only_baseline": only_base,
                    "p_mcnemar": stats.mcnemar_exact(only_arm, only_base) if arm != baseline else math.nan}
    return out


def replay_buckets(rows: list[dict]) -> dict:
    """{arm: [{k, replayed, share, target}]}: replays summed over seeds by source bucket, against the
    arm's target weights (normalised over k = 1..K-1; an empty bucket's share goes to the others)."""
    out = {}
    for arm in dict.fromkeys(r["arm"] for r in rows if r.get("seed") != "mean"):
        group = [r for r in rows if r["arm"] == arm and r.get("seed") != "mean"]
        counts: dict[int, float] = {}
        for r in group:
            for k, v in (r.get("replay_buckets") or {}).items():
                counts[int(k)] = counts.get(int(k), 0) + v
        weights = {int(k): v for k, v in (group[0].get("target_weights") or {}).items()}
        occupied = [r.get("bucket_occupancy") or {} for r in group]
        if counts:
            out[arm] = stats.replay_vs_target(counts, weights)
            for b in out[arm]:  # mean over seeds of the bucket's mean size per step
                sizes = [o[b["k"]] for o in ({int(k): v for k, v in o.items()} for o in occupied) if b["k"] in o]
                b["occupancy"] = sum(sizes) / len(sizes) if sizes else math.nan
    return out


def markdown(paired: dict, buckets: dict, collapsed: dict | None = None) -> list[str]:
    """The statistics section of the comparison's Markdown."""
    lines = _collapse_lines(collapsed) if collapsed and any(c["collapsed"] for c in collapsed.values()) else []
    lines += [] if not paired else ["", "## Paired against on_policy", "",
             "Per seed: arm minus on_policy with the same seed (same starting model, data order and sampling "
             "seed). Mean difference, 95% Student-t interval and percentile bootstrap interval over the seeds; "
             "`noise` means the t-interval holds 0: the data do not tell the arms apart. `p`: the paired t-test; "
             f"`p Holm`: Holm's correction over the {_family(paired)} final and area comparisons of this table "
             "(every arm, both metrics): an `ahead` or `behind` whose p Holm is 0.05 or more may be one of the "
             "chance findings that many comparisons make.", "",
             "| arm | metric | seeds | arm mean | on_policy mean | mean diff | 95% t-interval | 95% bootstrap | "
             "p | p Holm | seeds ahead / behind | verdict |", "|---|---|---:|---:|---:|---:|---|---|---:|---:|---|---|"]
    for arm, metrics in paired.items():
        for key, s in metrics.items():
            label = PAIRED_METRICS[key][0]
            digits = 0 if key == "responses_to_target" else 3
            lines.append(f"| {arm} | {label} | {s['n']}/{s['paired_seeds']} | {_f(s['arm_mean'], digits)} | "
                         f"{_f(s['baseline_mean'], digits)} | {_f(s['mean'], digits, True)} | "
                         f"{_f(s['t_lo'], digits, True)} .. {_f(s['t_hi'], digits, True)} | "
                         f"{_f(s['boot_lo'], digits, True)} .. {_f(s['boot_hi'], digits, True)} | "
                         f"{_p(s.get('p'))} | {_p(s.get('p_holm'))} | {s['ahead']} / {s['behind']} | {s['verdict']} |")
    if paired:
        lines += ["", "`seeds` = seeds in the statistic / paired seeds (responses-to-target uses only seeds where "
                  "both arms reached on-policy's final mean; a lower number is better there)."]
    if buckets:
        lines += ["", "## Replays by source bucket", "",
                  "Experiential questions by the bucket k (correct of K in the question's previous group) they were "
                  "drawn from, summed over seeds, against the arm's target share w(k/K) normalised over k = 1..K-1. "
                  "A share below target: that bucket was often empty (its weight went to the others); the second "
                  "line per arm is the bucket's size, questions whose latest group had k correct, averaged over "
                  "steps and seeds.", "",
                  "Cells: replayed (share vs target).", ""]
        ks = sorted({r["k"] for rs in buckets.values() for r in rs})
        lines += ["| arm | " + " | ".join(f"k={k}" for k in ks) + " |", "|---|" + "---|" * len(ks)]
        for arm, rs in buckets.items():
            by_k = {r["k"]: r for r in rs}
            lines.append(f"| {arm} | " + " | ".join(
                f"{by_k[k]['replayed']:.0f} ({_f(by_k[k]['share'], 2)} vs {_f(by_k[k]['target'], 2)})"
                if k in by_k else "—" for k in ks) + " |")
            lines.append(f"| {arm}: mean questions in bucket | " + " | ".join(
                _f(by_k[k].get("occupancy", math.nan), 1) if k in by_k else "—" for k in ks) + " |")
    return lines


def _family(paired: dict) -> int:
    return max((s.get("holm_family", 0) for m in paired.values() for s in m.values()), default=0)


def _p(p) -> str:
    """A p-value for the table: three decimals, '<0.001' below, '—' when missing."""
    if p is None or math.isnan(p):
        return "—"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def _collapse_lines(collapsed: dict) -> list[str]:
    lines = ["", "## Collapsed runs", "",
             f"A run collapsed when its final held-out pass@1 is below {COLLAPSE_FRACTION:g} x its step-0 value. "
             "Against on_policy on paired seeds: the seeds where only one of the two collapsed, and the exact "
             "McNemar test on them (`noise` when p >= 0.05).", "",
             "| arm | collapsed / runs | paired seeds | only this arm | only on_policy | McNemar p | verdict |",
             "|---|---|---:|---:|---:|---:|---|"]
    for arm, c in collapsed.items():
        p = c["p_mcnemar"]
        verdict = ("—" if math.isnan(p) else "noise" if p >= 0.05
                   else "fewer collapses" if c["only_arm"] < c["only_baseline"] else "more collapses")
        lines.append(f"| {arm} | {c['collapsed']} / {c['runs']} | {c['paired_seeds']} | {c['only_arm']} | "
                     f"{c['only_baseline']} | {_f(p, 3)} | {verdict} |")
    return lines


def _f(v, digits: int = 3, sign: bool = False) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    return f"{v:+.{digits}f}" if sign else f"{v:.{digits}f}"
