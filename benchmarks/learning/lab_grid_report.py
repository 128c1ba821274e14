"""The replay lab grid's pre-registered analysis (docs/benchmarks/preregistration_replay_lab.md), run only by
`python -m benchmarks.learning.lab_grid --final`: the verdict first (tuned-per-arm area difference with the
re-choosing paired seed bootstrap, flows/compare/tuned_report.py), then per-cell intervals, t and Wilcoxon
statements on the per-seed tuned differences beside the percentile interval, and the exploratory arms."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from scipy import stats as sps

from benchmarks.bench_record import RESULTS
from benchmarks.learning import lr_grid_report
from exgrpo_core.evaluation import stats, tuned
from flows.compare import tuned_report


def cell_intervals(m: dict) -> dict:
    """{arm: [{rate, mean, t_lo, t_hi, boot_lo, boot_hi}]} of each cell's area over its seeds (95%)."""
    out = {}
    for arm, g in m["grids"].items():
        out[arm] = []
        for j, x in enumerate(m["rates"]):
            xs = g["area"][j].tolist()
            t_lo, t_hi = stats.t_interval(xs)
            b_lo, b_hi = stats.bootstrap_interval(xs)
            out[arm].append({"rate": x, "mean": float(np.mean(xs)), "t_lo": t_lo, "t_hi": t_hi,
                             "boot_lo": b_lo, "boot_hi": b_hi})
    return out


def paired_tests(diffs) -> dict:
    """Mean of per-seed differences with its t interval, paired t-test p, Wilcoxon signed-rank p (scipy) and
    the seeds ahead / behind."""
    d = [float(x) for x in diffs]
    lo, hi = stats.t_interval(d)
    w = math.nan if len(d) < 2 or not any(d) else float(sps.wilcoxon(d).pvalue)
    return {"n": len(d), "mean": float(np.mean(d)), "t_lo": lo, "t_hi": hi, "t_p": stats.t_test_p(d),
            "wilcoxon_p": w, "ahead": sum(x > 0 for x in d), "behind": sum(x < 0 for x in d)}


def tuned_tests(m: dict, arm: str) -> dict:
    """The per-seed area differences at each arm's full-sample best rate (no re-choice), tested by t and Wilcoxon."""
    a, b = m["grids"][arm]["area"], m["grids"][m["baseline"]]["area"]
    ia, ib = tuned.best_rate_index(a), tuned.best_rate_index(b)
    return {"best_a": ia, "best_b": ib, **paired_tests(a[ia] - b[ib])}


def exploratory(explore: dict[str, dict], primary: dict[str, dict], rates: list[str], arms: list[str],
                base_arms: list[str]) -> dict:
    """Each exploratory arm against each primary arm, at every shared rate and tuned per arm, over the seeds
    every cell of both holds: descriptive, no verdict, no multiplicity correction."""
    out: dict = {}
    joint = {x: {**primary[x], "seeds": {s: {"results": primary[x]["seeds"][s]["results"]
                                              + explore[x]["seeds"][s]["results"]}
                                         for s in set(primary[x]["seeds"]) & set(explore[x]["seeds"])}}
             for x in rates if x in primary and x in explore}
    if len(joint) < len(rates):
        return out
    seeds = sorted(set.intersection(*(set(map(int, c["seeds"])) for c in joint.values())))
    if len(seeds) < 2:
        return out
    for arm in arms:
        for base in base_arms:
            try:
                m = lr_grid_report.matrices(joint, rates, [base, arm], seeds)
            except StopIteration:  # an arm missing from an archived seed
                continue
            a, b = m["grids"][arm]["area"], m["grids"][base]["area"]
            out[f"{arm} - {base}"] = {
                "seeds": seeds,
                "shared": [{"rate": x, **paired_tests(a[j] - b[j])} for j, x in enumerate(rates)],
                "tuned": {**tuned.tuned_bootstrap(a, b), **{k: v for k, v in tuned_tests({**m, "baseline": base}, arm)
                                                            .items() if k not in ("best_a", "best_b")}}}
    return out


def _f(x: float, fmt: str = "+.4f") -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _p(p: float) -> str:
    return "—" if p is None or math.isnan(p) else ("<0.001" if p < 0.001 else f"{p:.3f}")


def markdown(res: dict, cells: dict, tests: dict, explore: dict, rates: list[str], base: str) -> list[str]:
    md = list(tuned_report.markdown(res))
    md += ["", "## Beside the percentile interval (pre-registered as statements, not as the verdict)", "",
           "Per-seed area differences at each arm's full-sample best rate (the rates fixed, so the winner's curse "
           "of choosing them is not in these): mean, t interval, paired t-test p, Wilcoxon signed-rank p.", "",
           "| arm - baseline | rates | mean | t 95% interval | t p | Wilcoxon p | seeds ahead / behind |",
           "|---|---|---:|---|---:|---:|---|"]
    for arm, t in tests.items():
        md.append(f"| {arm} - {base} | {rates[t['best_a']]} / {rates[t['best_b']]} | {_f(t['mean'])} | "
                  f"{_f(t['t_lo'])} .. {_f(t['t_hi'])} | {_p(t['t_p'])} | {_p(t['wilcoxon_p'])} | "
                  f"{t['ahead']} / {t['behind']} of {t['n']} |")
    md += ["", "Each cell's mean area with its 95% t and percentile-bootstrap intervals over the seeds:", "",
           "| arm | lr | mean area | t interval | bootstrap interval |", "|---|---|---:|---|---|"]
    md += [f"| {arm} | {c['rate']} | {c['mean']:.4f} | {_f(c['t_lo'], '.4f')} .. {_f(c['t_hi'], '.4f')} | "
           f"{_f(c['boot_lo'], '.4f')} .. {_f(c['boot_hi'], '.4f')} |" for arm, cs in cells.items() for c in cs]
    if explore:
        md += ["", "## Exploratory arms (no verdict, no multiplicity correction)", "",
               "Area differences over the seeds every cell holds; `tuned`: each arm at its own best rate, with the "
               "re-choosing bootstrap interval.", "",
               "| comparison | " + " | ".join(f"lr {x}: mean (t interval)" for x in rates)
               + " | tuned: mean, 95% interval | Wilcoxon p (tuned) |", "|---|" + "---|" * (len(rates) + 2)]
        for k, e in explore.items():
            shared = " | ".join(f"{_f(s['mean'])} ({_f(s['t_lo'])} .. {_f(s['t_hi'])})" for s in e["shared"])
            t = e["tuned"]
            md.append(f"| {k} ({len(e['seeds'])} seeds) | {shared} | {_f(t['diff'])}, {_f(t['lo'])} .. {_f(t['hi'])} "
                      f"| {_p(t['wilcoxon_p'])} |")
    return md


def write(primary: dict[str, dict], explore: dict[str, dict], rates: list[str], arms: list[str],
          extra_arms: list[str], seeds: list[int], planned: int, stopped: str | None, out: Path = RESULTS) -> dict:
    """lab_grid_prereg.md and _curves.png in `out`; returns the JSON record."""
    m = lr_grid_report.matrices(primary, rates, arms, seeds)
    res = tuned_report.analyse(m)
    p = res["arms"][arms[1]]["primary"]
    cells = cell_intervals(m)
    tests = {arm: tuned_tests(m, arm) for arm in arms[1:]}
    ex = exploratory(explore, primary, rates, extra_arms, arms)
    commits = sorted({e.get("code", {}).get("head") or e["commit"] for c in [*primary.values(), *explore.values()]
                      for e in c["seeds"].values()})
    machines = sorted({e.get("machine", "unrecorded") for c in primary.values() for e in c["seeds"].values()})
    md = [f"# Pre-registered replay-lab grid: {arms[1]} against {arms[0]} on arith3, each at its own best rate", "",
          f"**Verdict: {p['verdict']}.** Tuned-per-arm area difference {p['diff']:+.4f}, 95% interval "
          f"{p['lo']:+.4f} .. {p['hi']:+.4f} ({arms[1]} best at lr {rates[p['best_a']]}, {arms[0]} at lr "
          f"{rates[p['best_b']]}; {len(seeds)} of {planned} planned seeds"
          + (f"; stopped early: {stopped}" if stopped else "") + ").", "",
          "Plan: [docs/benchmarks/preregistration_replay_lab.md](../../docs/benchmarks/preregistration_replay_lab.md). "
          "Command: `python -m benchmarks.learning.lab_grid --final`" + (f" --stopped {stopped!r}" if stopped else "")
          + f". Runs trained on commit(s) {', '.join(commits)}; machine record(s) {', '.join(machines)} "
          "(in each cell's archive).", "",
          *markdown(res, cells, tests, ex, rates, arms[0]), "", "![mean held-out curves](lab_grid_prereg_curves.png)"]
    (out / "lab_grid_prereg.md").write_text("\n".join(md) + "\n")
    lr_grid_report.plot(lr_grid_report.mean_curves(primary, rates, arms, seeds), out / "lab_grid_prereg_curves.png")
    return lr_grid_report.finite({"analysis": res, "cells": cells, "tuned_tests": tests, "exploratory": ex,
                                  "seeds": seeds, "planned_seeds": planned, "stopped": stopped, "commits": commits,
                                  "machines": machines})
