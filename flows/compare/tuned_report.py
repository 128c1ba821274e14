"""A sweep's tuned-per-arm section: when the grid crosses several arms with a learning-rate grid and
seeds, each arm is judged at its own best rate (by area under the held-out curve) against the baseline
arm at its own best rate, with a paired seed bootstrap that re-chooses the best rates in every resample
(exgrpo_core/evaluation/tuned.py), plus the comparisons at one shared rate and the learning-rate
equivalence factor. No Prefect import here.
"""

from __future__ import annotations

import math

import numpy as np

from exgrpo_core.evaluation import stats, tuned
from flows.compare.grid import grid_points, parse_grid, point_label

RATE_KEY = "train.lr"
BASELINES = ("arm=on_policy", "buffer.replay_ratio=0")  # the on-policy arm, when the grid has one
COLLAPSE_FRACTION = 0.5  # as flows/compare/stats.py: final held-out below half the step-0 value
FEW_SEEDS = 8  # below this a seed bootstrap's interval is flagged
MARGIN = 0.005  # the smallest area gain called practically relevant (docs/benchmarks/preregistration_lr_grid.md)


def layout(grid: list[str]) -> tuple[list[str], list[str], dict[str, tuple[str, str]]] | None:
    """(arms, rates, {point label: (arm, rate)}) when the grid has train.lr with 2+ values and 2+ arms (the
    other keys' combinations); None otherwise."""
    parsed = parse_grid(grid)
    keys = [k for k, _ in parsed]
    if RATE_KEY not in keys or len(dict(parsed)[RATE_KEY]) < 2 or len(keys) < 2:
        return None
    where, arms, rates = {}, [], dict(parsed)[RATE_KEY]
    for point in grid_points(parsed):
        arm = " ".join(o for o in point if not o.startswith(RATE_KEY + "="))
        where[point_label(point)] = (arm, next(o.split("=", 1)[1] for o in point if o.startswith(RATE_KEY + "=")))
        arms += [arm] if arm not in arms else []
    return arms, rates, where


def matrices(rows: list[dict], grid: list[str]) -> dict | None:
    """Per arm {area, final, start}[rate, seed] over the seeds finished in every cell; None when the sweep
    is not arms x rates x 2+ such seeds."""
    lay = layout(grid)
    if lay is None:
        return None
    arms, rates, where = lay
    cell: dict[tuple[str, str], dict[int, dict]] = {}
    for r in rows:
        if r.get("seed") != "mean" and r.get("arm") in where and not math.isnan(r.get("heldout_auc", math.nan)):
            cell.setdefault(where[r["arm"]], {})[r["seed"]] = r
    all_seeds = sorted({s for c in cell.values() for s in c})
    seeds = [s for s in all_seeds if all(s in cell.get((a, x), {}) for a in arms for x in rates)]
    if len(seeds) < 2:
        return None
    grids = {a: {k: np.array([[cell[(a, x)][s].get(key, math.nan) for s in seeds] for x in rates])
                 for k, key in (("area", "heldout_auc"), ("final", "heldout_avg"), ("start", "heldout_start"))}
             for a in arms}
    base = next((a for a in arms for b in BASELINES if b in a.split()), arms[0])
    return {"arms": arms, "baseline": base, "rates": rates, "seeds": seeds,
            "dropped_seeds": [s for s in all_seeds if s not in seeds], "grids": grids}


def analyse(m: dict, resamples: int = tuned.RESAMPLES, seed: int = 0) -> dict:
    """Every non-baseline arm against the baseline: the primary tuned-per-arm area difference, the naive
    fixed-best interval, four secondaries with Holm, each shared rate, and the equivalence factors."""
    rates = [float(x) for x in m["rates"]]
    b = m["grids"][m["baseline"]]
    draws = tuned.seed_draws(len(m["seeds"]), resamples, seed)
    kw = {"draws": draws}
    out = {"baseline": m["baseline"], "rates": m["rates"], "seeds": m["seeds"], "dropped_seeds": m["dropped_seeds"],
           "resamples": resamples, "bootstrap_seed": seed, "margin": MARGIN,
           "cells": {a: [{"rate": x, "area": float(np.mean(g["area"][j])), "final": float(np.mean(g["final"][j])),
                          "collapsed": int(np.sum(g["final"][j] < COLLAPSE_FRACTION * g["start"][j]))}
                         for j, x in enumerate(m["rates"])] for a, g in m["grids"].items()},
           "arms": {}}
    for arm in m["arms"]:
        if arm == m["baseline"]:
            continue
        a = m["grids"][arm]
        primary = tuned.tuned_bootstrap(a["area"], b["area"], **kw)
        primary["verdict"] = tuned.verdict(primary["lo"], primary["hi"], MARGIN)
        secondary = {
            "final at each arm's best rate": tuned.tuned_bootstrap(a["area"], b["area"], a["final"], b["final"], **kw),
            "area at the baseline's best rate": tuned.shared_best_bootstrap(b["area"], a["area"], b["area"], **kw),
            "final at the baseline's best rate": tuned.shared_best_bootstrap(b["area"], a["final"], b["final"], **kw),
            f"area at the highest rate ({m['rates'][-1]})": tuned.rate_bootstrap(a["area"], b["area"], len(rates) - 1, **kw),
        }
        holm = stats.holm({k: v["p"] for k, v in secondary.items()})
        for k, v in secondary.items():
            v["p_holm"] = holm[k]
        out["arms"][arm] = {
            "primary": primary, "naive_fixed_best": tuned.fixed_best_bootstrap(a["area"], b["area"], **kw),
            "secondary": secondary,
            "shared_rate_area": [{"rate": x, **tuned.rate_bootstrap(a["area"], b["area"], j, **kw)}
                                 for j, x in enumerate(m["rates"])],
            "equivalence": tuned.equivalence_factors(rates, a["area"], b["area"], **kw)}
    return out


def _p(p: float) -> str:
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def secondary_verdict(v: dict, alpha: float = 0.05) -> str:
    """ahead / behind when the Holm-corrected p is below alpha, else no difference shown."""
    if not v["p_holm"] < alpha:
        return "no difference shown"
    return "ahead" if v["diff"] > 0 else "behind"


def markdown(res: dict) -> list[str]:
    """The section's Markdown: primary first, then the secondaries (Holm), shared rates, equivalence, cells."""
    n, rates, base = len(res["seeds"]), res["rates"], res["baseline"]
    md = ["## Primary: each arm at its own best learning rate", "",
          f"Area under the held-out curve, paired by seed over {n} seeds finished in every cell"
          + (f" (left out, incomplete: {res['dropped_seeds']})" if res["dropped_seeds"] else "")
          + f"; rates {', '.join(rates)}. Interval: paired seed bootstrap ({res['resamples']} resamples) that "
          "re-chooses each arm's best rate in every resample; `fixed-best` is the naive interval with the rates "
          f"fixed at the full sample's choice. Verdict: ahead if the lower bound > 0, no practically relevant "
          f"gain if the upper bound < +{res['margin']:g}, else inconclusive."
          + (f" **Flag: {n} seeds; a bootstrap over fewer than {FEW_SEEDS} seeds is too narrow to trust.**"
             if n < FEW_SEEDS else ""), "",
          "| arm - baseline | best rate (arm / baseline) | difference | 95% interval | fixed-best interval | verdict |",
          "|---|---|---:|---|---|---|"]
    for arm, r in res["arms"].items():
        p, f = r["primary"], r["naive_fixed_best"]
        md.append(f"| {arm} - {base} | {rates[p['best_a']]} / {rates[p['best_b']]} | {p['diff']:+.4f} | "
                  f"{p['lo']:+.4f} .. {p['hi']:+.4f} | {f['lo']:+.4f} .. {f['hi']:+.4f} | {p['verdict']} |")
    for arm, r in res["arms"].items():
        md += ["", f"**{arm} - {base}, secondary** (bootstrap p, Holm over 4):", "",
               "| measure | difference | 95% interval | p | p Holm | verdict (Holm, 0.05) |", "|---|---:|---|---:|---:|---|"]
        md += [f"| {k} | {v['diff']:+.4f} | {v['lo']:+.4f} .. {v['hi']:+.4f} | {_p(v['p'])} | {_p(v['p_holm'])} | "
               f"{secondary_verdict(v)} |" for k, v in r["secondary"].items()]
        md += ["", "| rate | area difference at this shared rate | 95% interval | LR equivalence factor | 95% interval |",
               "|---|---:|---|---:|---|"]
        for s, e in zip(r["shared_rate_area"], r["equivalence"]):
            fac = "—" if math.isnan(e["factor"]) else f"{e['factor']:.2f}x"
            ci = "—" if math.isnan(e["lo"]) else f"{e['lo']:.2f} .. {e['hi']:.2f} (defined in {e['defined_share']:.0%})"
            md.append(f"| {s['rate']} | {s['diff']:+.4f} | {s['lo']:+.4f} .. {s['hi']:+.4f} | {fac} | {ci} |")
    md += ["", f"LR equivalence factor: the {base} rate whose mean area equals the arm's at that rate (linear in "
           f"log-rate on {base}'s rising branch), divided by the rate; — where none matches.", "",
           "| arm | " + " | ".join(f"lr {x}: area / final / collapsed" for x in rates) + " |",
           "|---|" + "---|" * len(rates)]
    md += [f"| {arm} | " + " | ".join(f"{c['area']:.4f} / {c['final']:.3f} / {c['collapsed']}" for c in cells) + " |"
           for arm, cells in res["cells"].items()]
    return md


def why_no_section(rows: list[dict], grid: list[str]) -> str | None:
    """The sentence a sweep whose grid is arms x rates shows when the tuned-per-arm comparison cannot be
    computed (no held-out area at all, or fewer than 2 seeds with one in every cell); None otherwise."""
    lay = layout(grid)
    if lay is None or matrices(rows, grid) is not None:
        return None
    arms, rates, where = lay
    cells = {cell: set() for cell in where.values()}
    for r in rows:
        if r.get("seed") != "mean" and r.get("arm") in where and not math.isnan(r.get("heldout_auc", math.nan)):
            cells[where[r["arm"]]].add(r["seed"])
    if not any(cells.values()):
        return ("No tuned-per-arm comparison: no run has a held-out area (it needs eval.suites and two evaluations "
                "per run: eval.at_start or eval.every).")
    complete = set.intersection(*cells.values())
    return (f"No tuned-per-arm comparison: {len(complete)} seed(s) with a held-out area in every (arm, rate) cell "
            f"{sorted(complete)}; it needs 2.")


def section(rows: list[dict], grid: list[str], resamples: int = tuned.RESAMPLES) -> dict | None:
    """{analysis, markdown} for a sweep's finished rows, or None when the grid is not arms x rates x seeds."""
    m = matrices(rows, grid)
    if m is None:
        return None
    res = analyse(m, resamples)
    return {"analysis": res, "markdown": markdown(res)}
