"""The comparison's statistics: every arm against on_policy over paired seeds, and where replays came from.

Pure functions over the rows of flows/compare/report.py (no Prefect); the numbers come from
exgrpo_core/evaluation/stats.py. Paired: arm seed s minus on_policy seed s, only seeds both finished.
"""

from __future__ import annotations

import math

import re

from exgrpo_core.evaluation import stats


def md_escape(text) -> str:
    """Text shown as-is in Markdown: `*`, backticks, brackets, `|`, a `<` that could open a tag and word-edge `_`
    backslashed (an underscore inside a word, as in `rho_0.25`, never emphasises, so it stays readable)."""
    text = re.sub(r"([\\`*\[\]|])", r"\\\1", str(text))
    return re.sub(r"(?<!\w)_|_(?!\w)", r"\_", re.sub(r"<(?=[A-Za-z/!?])", r"\<", text))

BASELINE = "on_policy"
# row key -> (label, what a positive difference means)
PAIRED_METRICS = {
    "heldout_avg": ("final held-out pass@1", "higher is better"),
    "heldout_auc": ("area under the held-out curve (mean pass@1 over steps)", "higher is better"),
    "heldout_gain": ("held-out gain over step 0", "higher is better"),
    "slots_to_target": ("rollout slots (B·K a step in every arm) to reach on-policy's final held-out pass@1",
                        "lower is better; only seeds where both arms reached it"),
}
LOWER_IS_BETTER = {"slots_to_target"}  # a negative difference is the arm doing better
# The family Holm's correction runs over: these metrics of every arm in the report (gain repeats the
# final's difference when the arms share their step-0 evaluation; slots-to-target is secondary)
HOLM_METRICS = ("heldout_avg", "heldout_auc")


def paired_stats(rows: list[dict], baseline: str = BASELINE, seed: int = 0) -> dict:
    """{arm: {metric: summary + per-seed differences}} for every arm but the baseline (seed rows only).

    Arm and baseline means are over the seeds in the difference only. Slots-to-target is a time to an
    event: a seed where only one arm reached the target is censored, not dropped (`censored`: the paired
    Gehan sign test of exgrpo_core/evaluation/stats.py, its p in `p`); its mean and t-interval are over the
    seeds where both reached it. Verdicts: see `final_verdict`.
    """
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
        paired = [s for s in by_seed if s in per[baseline]]
        for key in PAIRED_METRICS:
            a = {s: by_seed[s].get(key, math.nan) for s in paired}
            b = {s: per[baseline][s].get(key, math.nan) for s in paired}
            diffs = stats.paired_differences(a, b)
            summary = stats.summarise_differences(list(diffs.values()), seed=seed)
            why = missing_cause(key, {arm: [by_seed[s] for s in paired], baseline: [per[baseline][s] for s in paired]})
            why = why or _seed_cause(arm, sorted(by_seed), sorted(per[baseline]), baseline)
            if why or summary["cause"]:
                summary = {**summary, "verdict": "no statistic", "cause": why or _value_cause(summary, len(paired))}
            extra = {}
            if key == "slots_to_target":
                scores = stats.censored_pair_scores({s: (a[s], by_seed[s].get("slots_trained", math.nan), b[s],
                                                         per[baseline][s].get("slots_trained", math.nan))
                                                     for s in paired})
                extra["censored"] = {**stats.censored_sign_test(scores), "scores": {str(s): v for s, v in scores.items()},
                                     "only_arm": sum(not math.isnan(a[s]) and math.isnan(b[s]) for s in paired),
                                     "only_baseline": sum(math.isnan(a[s]) and not math.isnan(b[s]) for s in paired),
                                     "neither": sum(math.isnan(a[s]) and math.isnan(b[s]) for s in paired)}
                t = _lower_is_better(summary)  # the t-interval over the seeds where both reached it
                summary = {**summary, "p": math.nan if why else extra["censored"]["p"], "p_signflip": math.nan,
                           "p_t": t["p"], "t_verdict": t["verdict"],
                           "ahead": extra["censored"]["earlier"], "behind": extra["censored"]["later"],
                           "verdict": "no statistic" if why else _censored_verdict(summary, extra["censored"]),
                           "cause": why}  # the censored test needs no two seeds where both reached the target
            elif key in LOWER_IS_BETTER:
                summary = _lower_is_better(summary)
            out[arm][key] = {**summary, **extra,
                             "differences": {str(s): d for s, d in diffs.items()},
                             "arm_mean": stats.mean([a[s] for s in diffs]),
                             "baseline_mean": stats.mean([b[s] for s in diffs]),
                             "arm_reached": sum(not math.isnan(v) for v in a.values()),
                             "paired_seeds": len(paired)}
    adjusted = stats.holm({(arm, key): out[arm][key]["p"] for arm in out for key in HOLM_METRICS})
    family = sum(not math.isnan(p) for p in adjusted.values())  # a statistic with no p is not tested
    for (arm, key), p in adjusted.items():
        out[arm][key]["p_holm"] = p
        out[arm][key]["holm_family"] = family
    for metrics in out.values():
        for s in metrics.values():
            s["final_verdict"] = final_verdict(s)
    return out


def missing_cause(key: str, sides: dict[str, list[dict]]) -> str | None:
    """Why metric `key` has no value on any paired seed of an arm, read from the rows ({arm: rows}):
    no held-out evaluation, no step-0 evaluation (gain), a single evaluation per run (area); None when
    every side has a value on some seed (or the rows do not tell)."""
    def empty(rows, k):
        return not any(_finite(r.get(k)) for r in rows)

    lacking = [name for name, rows in sides.items() if rows and empty(rows, key)]
    if not lacking:
        return None
    who = " and ".join(lacking)
    if all(empty(sides[n], "heldout_avg") for n in lacking):
        return f"no held-out evaluation in {who} (eval.suites and data.eval_path empty, or --no-eval)"
    if key == "heldout_gain" and all(empty(sides[n], "heldout_start") for n in lacking):
        return f"no step-0 evaluation in {who} (eval.at_start off)"
    if key == "heldout_auc":
        return f"one held-out evaluation per run in {who}: the area needs two (eval.at_start or eval.every)"
    return None


def _seed_cause(arm: str, arm_seeds: list, base_seeds: list, baseline: str) -> str | None:
    """Fewer than two seeds finished in both the arm and the baseline: which seeds each has."""
    paired = [s for s in arm_seeds if s in base_seeds]
    if len(paired) >= 2:
        return None
    return (f"{len(paired)} paired seed{'' if len(paired) == 1 else 's'} (seeds {arm}: {arm_seeds}, {baseline}: "
            f"{base_seeds}): a statistic needs 2")


def _value_cause(summary: dict, paired: int) -> str:
    """The summary's own cause, naming how many of the paired seeds had a value in both arms."""
    if summary["n"] < 2 and summary["n"] < paired:
        return (f"{summary['n']} of {paired} paired seeds with a value in both arms (a run without the metric): "
                "a statistic needs 2")
    return summary["cause"]


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v)


def unpaired_line(rows: list[dict], baseline: str = BASELINE) -> str:
    """The sentence a report shows instead of the paired statistics when there is nothing to pair."""
    arms = list(dict.fromkeys(r["arm"] for r in rows if r.get("seed") != "mean"))
    if baseline not in arms:
        return f"No paired statistics: no finished {baseline} run to pair the arms with (arms: {', '.join(arms)})."
    return f"No paired statistics: {baseline} is the only arm."


def _censored_verdict(summary: dict, censored: dict) -> str:
    """ahead (arm reached the target first in more pairs) / behind on the censored test's p < 0.05, else null."""
    if not censored["earlier"] + censored["later"]:
        return "null"
    if censored["p"] < 0.05:
        return "ahead" if censored["earlier"] > censored["later"] else "behind"
    return "null"


def final_verdict(s: dict, p_holm_key: str = "p_holm") -> str:
    """The verdict the table shows. `ahead` / `behind` only on a Holm-corrected p below 0.05; a difference
    significant before correction, or outside the corrected family, is `hint: ...` with its uncorrected p;
    a null says how large a difference the interval still allows: `null: |diff| < bound at 95%`; a
    statistic that cannot be computed says why: `no statistic: <cause>`."""
    v, p_holm = s["verdict"], s.get(p_holm_key, math.nan)
    if s.get("cause"):
        return f"no statistic: {s['cause']}"
    if v in ("ahead", "behind"):
        if p_holm is not None and not math.isnan(p_holm) and p_holm < 0.05:
            return v
        why = "not in the corrected family" if p_holm is None or math.isnan(p_holm) else f"Holm p {_p(p_holm)}"
        return f"hint: {v} (uncorrected p {_p(s['p'])}; {why})"
    if v == "null" and "censored" in s:
        c = s["censored"]
        if s.get("t_verdict") in ("ahead", "behind"):  # the interval shown excludes 0: a hint, as the legend says
            return (f"hint: {s['t_verdict']} (t-interval over the {s['n']} seeds both reached excludes 0, uncorrected "
                    f"p (t) {_p(s.get('p_t'))}; censored sign test p {_p(s['p'])}; not in the corrected family)")
        return (f"null (censored sign test p {_p(s['p'])})" if c["earlier"] + c["later"]
                else f"null: no pair ordered ({c['undetermined']} tied or censored)")
    if v == "null":
        return f"null: |diff| < {s['bound']:.3f} at {s['level']:.0%}"
    return v


def holm_across(tables: dict[str, dict]) -> dict:
    """Holm's correction over a family spanning several comparisons: tables = {name: paired_stats output};
    the HOLM_METRICS of every arm of every table form one family. Sets `p_holm_family`, `family_size` and
    `family_verdict` in each summary; returns {(name, arm, metric): adjusted p}."""
    adjusted = stats.holm({(name, arm, key): t[arm][key]["p"] for name, t in tables.items() for arm in t
                           for key in HOLM_METRICS})
    for (name, arm, key), p in adjusted.items():
        s = tables[name][arm][key]
        s.update(p_holm_family=p, family_size=len(adjusted))
        s["family_verdict"] = final_verdict(s, "p_holm_family")
    return adjusted


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
                    "p_mcnemar": stats.mcnemar_exact(only_arm, only_base) if arm != baseline and base else math.nan}
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


def markdown(paired: dict, buckets: dict, collapsed: dict | None = None, label: str = "arm") -> list[str]:
    """The statistics section of the comparison's Markdown; `label` heads the rows' column (a sweep's are grid
    points). Row names are escaped (`md_escape`)."""

    lines = _collapse_lines(collapsed, label) if collapsed and any(c["collapsed"] for c in collapsed.values()) else []
    lines += [] if not paired else ["", "## Paired against on_policy", "", *paired_legend(_family(paired)), "",
             "| " + " | ".join(PAIRED_MAIN) + " |", "|---|---|---:|---:|---|---:|---|"]
    rows = [(arm, key, dict(zip(PAIRED_HEADER, _summary_list(s, key)))) for arm, metrics in paired.items()
            for key, s in metrics.items()]
    lines += [f"| {md_escape(arm)} | {PAIRED_METRICS[key][0]} | " + " | ".join(c[h] for h in PAIRED_MAIN[2:]) + " |"
              for arm, key, c in rows]
    if paired:
        lines += ["", "### Paired details", "", "| " + " | ".join(PAIRED_DETAIL) + " |", "|---|---|---:|---:|---|---:|---:|---|"]
        lines += [f"| {md_escape(arm)} | {PAIRED_METRICS[key][0]} | " + " | ".join(c[h] for h in PAIRED_DETAIL[2:])
                  + " |" for arm, key, c in rows]
        lines += ["", "`seeds` = seeds in the statistic / paired seeds. Slots-to-target: rollout slots trained on (B·K "
                  "a step, the same in every arm, so a replay arm is not credited with the response it does not "
                  "generate per experiential question) until the first evaluation at or above on-policy's final mean. "
                  "The means, difference and t-interval are over the seeds where both arms reached it (a lower number "
                  "is better); a seed where only one arm reached it is censored, not dropped: `p (t)` there is the "
                  "paired Gehan (censored sign) test over all paired seeds, each run censored at the pair's smaller "
                  "slot count, and `seeds ahead / behind` count the pairs where the arm reached the target first / "
                  f"later ({_censored_counts(paired)}). Its verdict is the censored test's, a `hint` when only the "
                  "t-interval excludes 0."]
    if buckets:
        lines += ["", "## Replays by source bucket", "",
                  "Experiential questions drawn, by the bucket k (correct of K in the question's previous group) they "
                  "were drawn from, summed over seeds, against the target share w(k/K) normalised over k = 1..K-1. "
                  "Every drawn question counts, with or without its replayed trajectory: `drawn` is the rollout "
                  "budget table's `experiential questions` (= `replayed` + `unfilled replay slots`) summed over "
                  "seeds. A share below target: that bucket was often empty (its weight went to the others); the "
                  f"second line per {label} is the bucket's size, questions whose latest group had k correct, "
                  "averaged over steps and seeds.", "",
                  "Cells: drawn (share vs target).", ""]
        ks = sorted({r["k"] for rs in buckets.values() for r in rs})
        lines += [f"| {label} | " + " | ".join(f"k={k}" for k in ks) + " | drawn |", "|---|" + "---|" * (len(ks) + 1)]
        for arm, rs in buckets.items():
            by_k = {r["k"]: r for r in rs}
            lines.append(f"| {md_escape(arm)} | " + " | ".join(
                f"{by_k[k]['replayed']:.0f} ({_f(by_k[k]['share'], 2)} vs {_f(by_k[k]['target'], 2)})"
                if k in by_k else "—" for k in ks) + f" | {sum(r['replayed'] for r in rs):.0f} |")
            lines.append(f"| {md_escape(arm)}: mean questions in bucket | " + " | ".join(
                _f(by_k[k].get("occupancy", math.nan), 1) if k in by_k else "—" for k in ks) + " | |")
    return lines


def paired_legend(family: int, scope: str = "this table") -> list[str]:
    """What the paired table's columns and verdicts mean."""
    return ["Per seed: arm minus on_policy with the same seed (same starting model, data order and sampling seed). "
            "Mean difference over the paired seeds, 95% Student-t interval and percentile bootstrap interval "
            f"(resampling seeds; marked `(n < {stats.MIN_BOOTSTRAP_SEEDS})` where too few seeds make it too narrow). "
            "`p (t)`: the paired t-test; `p sign-flip`: the sign-flip permutation test (exact up to "
            f"{stats.SIGN_FLIP_EXACT_MAX} seeds, else Monte Carlo, marked `~`); {_holm_scope(family, scope)}. The "
            "verdict uses the corrected p: `ahead` / `behind` only at p Holm < 0.05; a difference whose t-interval "
            "excludes 0 before correction only, or a metric outside the corrected family, is a `hint` with its "
            "uncorrected p; `null: |diff| < b at 95%` means the data do not tell the arms apart and the t-interval "
            "still allows a difference up to b either way; `no statistic: ...` names why a row has no interval or test "
            "(no held-out or step-0 evaluation, fewer than 2 paired seeds with a value, zero variance)."]


def _holm_scope(family: int, scope: str) -> str:
    """The legend's `p Holm` sentence: the family's size, or that there was nothing to correct."""
    if family == 0:
        return (f"`p Holm`: Holm's correction of `p (t)` over the final and area comparisons of {scope}; none "
                "of them has a `p (t)` here, so nothing is corrected (—)")
    return (f"`p Holm`: Holm's correction of `p (t)` over the {family} final and area "
            f"comparison{'' if family == 1 else 's'} of {scope} with a `p (t)` (every arm, both metrics)")


PAIRED_HEADER = ("seeds", "arm mean", "on_policy mean", "mean diff", "95% t-interval", "95% bootstrap", "p (t)",
                 "p sign-flip", "p Holm", "seeds ahead / behind", "verdict")
"""summary_cells' columns; the report shows them as two tables of at most 8 columns: main, then details."""
PAIRED_MAIN = ("arm", "metric", "seeds", "mean diff", "95% t-interval", "p Holm", "verdict")
PAIRED_DETAIL = ("arm", "metric", "arm mean", "on_policy mean", "95% bootstrap", "p (t)", "p sign-flip",
                 "seeds ahead / behind")


def summary_cells(s: dict, key: str = "", verdict_key: str = "final_verdict", p_holm_key: str = "p_holm") -> str:
    """One paired table row's cells from `seeds` to `verdict` (PAIRED_HEADER), joined by ' | '."""
    return " | ".join(_summary_list(s, key, verdict_key, p_holm_key))


def _summary_list(s: dict, key: str = "", verdict_key: str = "final_verdict", p_holm_key: str = "p_holm") -> list[str]:
    digits = 0 if key == "slots_to_target" else 3
    boot = f"{_f(s['boot_lo'], digits, True)} .. {_f(s['boot_hi'], digits, True)}"
    if s.get("boot_few") and s["n"] >= 2 and not s.get("cause"):
        boot += f" (n < {stats.MIN_BOOTSTRAP_SEEDS})"
    flip = _p(s.get("p_signflip"))
    flip = flip if s.get("signflip_exact", True) or flip == "—" else f"~{flip}"

    verdict = md_escape(s.get(verdict_key, s["verdict"]))  # it names arms and causes: shown as written
    return [f"{s['n']}/{s['paired_seeds']}", _f(s["arm_mean"], digits), _f(s["baseline_mean"], digits),
            _f(s["mean"], digits, True), f"{_f(s['t_lo'], digits, True)} .. {_f(s['t_hi'], digits, True)}",
            boot, _p(s.get("p")), flip, _p(s.get(p_holm_key)), f"{s['ahead']} / {s['behind']}", verdict]


def _censored_counts(paired: dict) -> str:

    return "; ".join(f"{md_escape(arm)}: {c['only_arm']} seed(s) only the arm reached it, {c['only_baseline']} only on_policy, "
                     f"{c['neither']} neither" for arm, m in paired.items()
                     for c in [m.get("slots_to_target", {}).get("censored")] if c)


def _family(paired: dict) -> int:
    return max((s.get("holm_family", 0) for m in paired.values() for s in m.values()), default=0)


def _p(p) -> str:
    """A p-value for the table: three decimals, '<0.001' below, '—' when missing."""
    if p is None or math.isnan(p):
        return "—"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def _collapse_lines(collapsed: dict, label: str = "arm") -> list[str]:

    lines = ["", "## Collapsed runs", "",
             f"A run collapsed when its final held-out pass@1 is below {COLLAPSE_FRACTION:g} x its step-0 value. "
             "Against on_policy on paired seeds: the seeds where only one of the two collapsed, and the exact "
             "McNemar test on them (`null` when p >= 0.05: no difference in collapses shown).", "",
             f"| {label} | collapsed / runs | paired seeds | only this {label} | only on_policy | McNemar p | verdict |",
             "|---|---|---:|---:|---:|---:|---|"]
    for arm, c in collapsed.items():
        p = c["p_mcnemar"]
        verdict = ("—" if math.isnan(p) else "null" if p >= 0.05
                   else "fewer collapses" if c["only_arm"] < c["only_baseline"] else "more collapses")
        lines.append(f"| {md_escape(arm)} | {c['collapsed']} / {c['runs']} | {c['paired_seeds']} | {c['only_arm']} | "
                     f"{c['only_baseline']} | {_f(p, 3)} | {verdict} |")
    return lines


def _f(v, digits: int = 3, sign: bool = False) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    return f"{v:+.{digits}f}" if sign else f"{v:.{digits}f}"
