"""Tuned-per-arm comparisons: each arm judged at its own best learning rate from one shared grid.

Inputs are arrays `area[rate, seed]` (one per arm, the same rates and seeds, paired by seed; any
per-run measure works, the area under the held-out curve is the usual one). A paired seed bootstrap
draws seeds with replacement, the same draw for every cell of every arm, and re-chooses each arm's
best rate inside every resample, so the winner's curse of picking the best of several rates is in
the interval. Pure numpy; no flow or tracking imports (flows/compare/tuned_report.py formats it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

RESAMPLES = 10_000
LEVEL = 0.95


def _grid(x) -> np.ndarray:
    a = np.asarray(x, dtype=float)
    if a.ndim != 2 or a.shape[0] < 1 or a.shape[1] < 1:
        raise ValueError(f"expected values[rate, seed] with at least one rate and seed, got shape {a.shape}")
    return a


def best_rate_index(area) -> int:
    """Tuned rate: the index of the rate with the highest mean over seeds (a tie goes to the lowest rate)."""
    return int(np.argmax(_grid(area).mean(axis=1)))


def tuned_difference(area_a, area_b, value_a=None, value_b=None) -> float:
    """Tuned-per-arm difference: mean of `value_a` at A's best rate minus `value_b` at B's (best by area)."""
    va, vb = _grid(area_a if value_a is None else value_a), _grid(area_b if value_b is None else value_b)
    return float(va[best_rate_index(area_a)].mean() - vb[best_rate_index(area_b)].mean())


def seed_draws(n_seeds: int, resamples: int = RESAMPLES, seed: int = 0) -> np.ndarray:
    """Paired seed bootstrap draws: `resamples` rows of `n_seeds` seed indices drawn with replacement."""
    return np.random.default_rng(seed).integers(0, n_seeds, size=(resamples, n_seeds))


def _means(values: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """Per-resample cell means, shape (resamples, rates)."""
    return values[:, draws].mean(axis=2).T


def _best(area: np.ndarray, draws: np.ndarray) -> np.ndarray:
    return np.argmax(_means(area, draws), axis=1)  # argmax keeps the first (lowest) rate on ties


def bootstrap_p(draws_of_stat: np.ndarray) -> float:
    """Two-sided bootstrap p of 0: twice the smaller share of resamples at or beyond 0, +1-corrected, at most 1."""
    d = np.asarray(draws_of_stat, dtype=float)
    d = d[np.isfinite(d)]
    if d.size == 0:
        return math.nan
    tail = min(np.sum(d <= 0), np.sum(d >= 0))
    return float(min(1.0, 2 * (tail + 1) / (d.size + 1)))


def _summary(point: float, draws_of_stat: np.ndarray, level: float) -> dict:
    lo, hi = np.percentile(draws_of_stat, [50 * (1 - level), 50 * (1 + level)])
    return {"diff": point, "lo": float(lo), "hi": float(hi), "p": bootstrap_p(draws_of_stat), "level": level}


def tuned_bootstrap(area_a, area_b, value_a=None, value_b=None, resamples: int = RESAMPLES, seed: int = 0,
                    level: float = LEVEL, draws: np.ndarray | None = None) -> dict:
    """Paired seed bootstrap of the tuned-per-arm difference, each arm's best rate re-chosen by area in every resample.

    Returns diff (full sample), lo/hi (percentile interval), p (two-sided, of 0), best_a/best_b (full-sample
    indices) and share_best_a/share_best_b (how often each rate was chosen over the resamples).
    """
    area_a, area_b = _grid(area_a), _grid(area_b)
    va, vb = _grid(area_a if value_a is None else value_a), _grid(area_b if value_b is None else value_b)
    _same_seeds(area_a, area_b, va, vb)
    draws = seed_draws(area_a.shape[1], resamples, seed) if draws is None else draws
    rows = np.arange(draws.shape[0])
    ba, bb = _best(area_a, draws), _best(area_b, draws)
    stat = _means(va, draws)[rows, ba] - _means(vb, draws)[rows, bb]
    out = _summary(tuned_difference(area_a, area_b, va, vb), stat, level)
    out.update(best_a=best_rate_index(area_a), best_b=best_rate_index(area_b),
               share_best_a=_shares(ba, area_a.shape[0]), share_best_b=_shares(bb, area_b.shape[0]))
    return out


def fixed_best_bootstrap(area_a, area_b, resamples: int = RESAMPLES, seed: int = 0, level: float = LEVEL,
                         draws: np.ndarray | None = None) -> dict:
    """The naive interval: the same bootstrap with both best rates fixed at the full sample's choice (no re-choice)."""
    area_a, area_b = _grid(area_a), _grid(area_b)
    return rate_bootstrap(area_a, area_b, best_rate_index(area_a), best_rate_index(area_b),
                          resamples=resamples, seed=seed, level=level, draws=draws)


def rate_bootstrap(value_a, value_b, rate_a: int, rate_b: int | None = None, resamples: int = RESAMPLES,
                   seed: int = 0, level: float = LEVEL, draws: np.ndarray | None = None) -> dict:
    """Paired seed bootstrap of the difference at fixed rates: A at `rate_a` minus B at `rate_b` (default the same)."""
    va, vb = _grid(value_a), _grid(value_b)
    _same_seeds(va, vb)
    rate_b = rate_a if rate_b is None else rate_b
    draws = seed_draws(va.shape[1], resamples, seed) if draws is None else draws
    stat = va[rate_a][draws].mean(axis=1) - vb[rate_b][draws].mean(axis=1)
    return _summary(float(va[rate_a].mean() - vb[rate_b].mean()), stat, level)


def shared_best_bootstrap(select, value_a, value_b, resamples: int = RESAMPLES, seed: int = 0,
                          level: float = LEVEL, draws: np.ndarray | None = None) -> dict:
    """Both arms at one shared rate, the best rate of `select` (e.g. on-policy's area), re-chosen in every resample."""
    select, va, vb = _grid(select), _grid(value_a), _grid(value_b)
    _same_seeds(select, va, vb)
    draws = seed_draws(va.shape[1], resamples, seed) if draws is None else draws
    rows, best = np.arange(draws.shape[0]), _best(select, draws)
    stat = _means(va, draws)[rows, best] - _means(vb, draws)[rows, best]
    j = best_rate_index(select)
    return {**_summary(float(va[j].mean() - vb[j].mean()), stat, level), "rate": j,
            "share_rate": _shares(best, select.shape[0])}


def equivalence_rate(rates: Sequence[float], mean_area_b: Sequence[float], target: float) -> float:
    """Learning-rate equivalence: B's rate whose mean area equals `target`, linear in log-rate on B's rising branch.

    The branch runs from the lowest rate up to B's best; NaN when `target` lies outside B's areas there.
    """
    r, y = np.asarray(rates, dtype=float), np.asarray(mean_area_b, dtype=float)
    top = int(np.argmax(y))
    if top == 0:
        return float(r[0]) if target == y[0] else math.nan
    x, y = np.log(r[: top + 1]), np.maximum.accumulate(y[: top + 1])  # the rising branch, made monotone
    if not (y[0] <= target <= y[-1]):
        return math.nan
    k = max(1, int(np.searchsorted(y, target, side="left")))
    if y[k] == y[k - 1]:
        return float(math.exp(x[k - 1]))
    return float(math.exp(x[k - 1] + (target - y[k - 1]) * (x[k] - x[k - 1]) / (y[k] - y[k - 1])))


def equivalence_factors(rates: Sequence[float], area_a, area_b, resamples: int = RESAMPLES, seed: int = 0,
                        level: float = LEVEL, draws: np.ndarray | None = None) -> list[dict]:
    """Per rate r: B's equivalent rate for A's mean area at r, divided by r (the LR multiplier A is worth), with bootstrap percentiles."""
    area_a, area_b = _grid(area_a), _grid(area_b)
    _same_seeds(area_a, area_b)
    draws = seed_draws(area_a.shape[1], resamples, seed) if draws is None else draws
    ma, mb = _means(area_a, draws), _means(area_b, draws)
    out = []
    for j, r in enumerate(rates):
        point = equivalence_rate(rates, area_b.mean(axis=1), float(area_a[j].mean())) / r
        boot = np.array([equivalence_rate(rates, mb[i], ma[i, j]) / r for i in range(draws.shape[0])])
        ok = boot[np.isfinite(boot)]
        lo, hi = (np.percentile(ok, [50 * (1 - level), 50 * (1 + level)]) if ok.size else (math.nan, math.nan))
        out.append({"rate": float(r), "factor": point, "lo": float(lo), "hi": float(hi),
                    "defined_share": float(ok.size / draws.shape[0])})
    return out


def verdict(lo: float, hi: float, margin: float) -> str:
    """Decision on an interval of A - B: ahead if lo > 0; no practically relevant gain if hi < margin; else inconclusive."""
    if lo > 0:
        return "ahead" if hi >= margin else f"ahead, by less than {margin:g}"
    return "no practically relevant gain" if hi < margin else "inconclusive"


def _shares(idx: np.ndarray, n: int) -> list[float]:
    return (np.bincount(idx, minlength=n) / idx.size).tolist()


def _same_seeds(*grids: np.ndarray) -> None:
    shapes = {g.shape for g in grids}
    if len(shapes) > 1:
        raise ValueError(f"arms must share rates and seeds (paired by seed); got shapes {sorted(shapes)}")
