"""The pre-registered analysis of the learning-rate grid (docs/benchmarks/preregistration_lr_grid.md),
run only by `python -m benchmarks.learning.lr_grid --final`: the tuned-per-arm section of
flows/compare/tuned_report.py (the library's exgrpo_core/evaluation/tuned.py) on the cells' seed
archives, the verdict first, and a plot of the mean held-out curves per arm and rate."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from benchmarks.bench_record import RESULTS
from flows.compare import tuned_report

KEYS = (("area", "heldout_auc"), ("final", "heldout_avg"), ("start", "heldout_start"))


def matrices(cells: dict[str, dict], rates: list[str], arms: list[str], seeds: list[int]) -> dict:
    """tuned_report.matrices' shape from the cells' seed archives ({rate: archive}), on the given seeds."""
    def row(rate, seed, arm):
        return next(r["row"] for r in cells[rate]["seeds"][str(seed)]["results"] if r["row"]["arm"] == arm)

    grids = {a: {k: np.array([[row(x, s, a)[key] for s in seeds] for x in rates]) for k, key in KEYS} for a in arms}
    return {"arms": arms, "baseline": arms[0], "rates": rates, "seeds": seeds, "dropped_seeds": [], "grids": grids}


def mean_curves(cells: dict[str, dict], rates: list[str], arms: list[str], seeds: list[int]) -> dict:
    """{arm: {rate: (steps, mean held-out pass@1 over the seeds)}}."""
    out: dict = {a: {} for a in arms}
    for a in arms:
        for x in rates:
            runs = [next(r for r in cells[x]["seeds"][str(s)]["results"] if r["row"]["arm"] == a) for s in seeds]
            out[a][x] = ([st + 1 for st in runs[0]["curves"]["heldout_step"]],
                         np.mean([r["curves"]["heldout_pass1"] for r in runs], axis=0).tolist())
    return out


def write(cells: dict[str, dict], rates: list[str], arms: list[str], seeds: list[int], planned: int,
          stopped: str | None, out: Path = RESULTS) -> dict:
    """lr_grid_prereg.md and _curves.png in `out`; returns the record (analysis, seeds, provenance) for the JSON."""
    res = tuned_report.analyse(matrices(cells, rates, arms, seeds))
    primary = res["arms"][arms[1]]["primary"]
    reuse = {x: c.get("reuse") for x, c in cells.items() if c.get("reuse")}
    commits = sorted({e.get("code", {}).get("head") or e["commit"] for c in cells.values() for e in c["seeds"].values()})
    md = [f"# Pre-registered learning-rate grid: {arms[1]} against {arms[0]}, each at its own best rate", "",
          f"**Verdict: {primary['verdict']}.** Tuned-per-arm area difference {primary['diff']:+.4f}, 95% interval "
          f"{primary['lo']:+.4f} .. {primary['hi']:+.4f} ({arms[1]} best at lr {rates[primary['best_a']]}, {arms[0]} at "
          f"lr {rates[primary['best_b']]}; {len(seeds)} of {planned} planned seeds"
          + (f"; stopped early: {stopped}" if stopped else "") + ").", "",
          "Plan: [docs/benchmarks/preregistration_lr_grid.md](../../docs/benchmarks/preregistration_lr_grid.md). "
          "Command: `python -m benchmarks.learning.lr_grid --final`"
          + (f" --stopped {stopped!r}" if stopped else "") + f". Runs trained on commit(s) {', '.join(commits)}; "
          "reuse checks: " + ("; ".join(f"lr {x} from {r['source']}: {'reused' if r['ok'] else 'not reused'}"
                                        for x, r in reuse.items()) or "none") + ".", "",
          *tuned_report.markdown(res), "", "![mean held-out curves](lr_grid_prereg_curves.png)"]
    (out / "lr_grid_prereg.md").write_text("\n".join(md) + "\n")
    plot(mean_curves(cells, rates, arms, seeds), out / "lr_grid_prereg_curves.png")
    return {"analysis": res, "seeds": seeds, "planned_seeds": planned, "stopped": stopped, "reuse": reuse,
            "commits": commits}


def plot(curves: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(curves), figsize=(6 * len(curves), 4), sharey=True)
    for ax, (arm, by_rate) in zip(np.atleast_1d(axes), curves.items()):
        for rate, (x, y) in by_rate.items():
            ax.plot(x, y, label=f"lr {rate}")
        ax.set(title=arm, xlabel="step", ylabel="held-out pass@1 (mean over seeds)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def finite(obj):
    """NaN -> None for strict JSON."""
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [finite(v) for v in obj]
    return None if isinstance(obj, float) and math.isnan(obj) else obj
