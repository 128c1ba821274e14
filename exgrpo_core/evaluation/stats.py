"""Statistics of a comparison between arms over paired seeds (issue 15): pure functions, numbers in and out.

Seeds pair the arms: arm A's seed s and the baseline's seed s share the starting model, the data
order and the sampling seed, so the per-seed difference removes what the seed does to both. Only
seeds present in both arms are used (an interrupted driver never leaves an unmatched run in the
statistics). An interval is a 95% Student-t interval of the mean difference and a percentile bootstrap
interval (seeded, reproducible); a difference whose interval holds 0 is reported as noise.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence

NAN = float("nan")


def _finite(xs) -> list[float]:
    return [float(x) for x in xs if x is not None and not math.isnan(float(x))]


def mean(xs: Sequence[float]) -> float:
    xs = _finite(xs)
    return sum(xs) / len(xs) if xs else NAN


def sd(xs: Sequence[float]) -> float:
    """Sample standard deviation (n - 1); NaN for fewer than two values."""
    xs = _finite(xs)
    if len(xs) < 2:
        return NAN
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def _t_pdf(x: float, df: float) -> float:
    c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    return math.exp(c - (df + 1) / 2 * math.log1p(x * x / df))


def t_cdf(x: float, df: float) -> float:
    """Student-t CDF by Simpson's rule on the density (|x| <= 60 covers every quantile used here)."""
    if x < 0:
        return 1.0 - t_cdf(-x, df)
    n = 2000  # even
    h = min(x, 60.0) / n
    s = _t_pdf(0.0, df) + _t_pdf(min(x, 60.0), df)
    s += sum((4 if i % 2 else 2) * _t_pdf(i * h, df) for i in range(1, n))
    return min(1.0, 0.5 + s * h / 3)


def t_quantile(p: float, df: float) -> float:
    """x with t_cdf(x, df) = p, by bisection; e.g. t_quantile(0.975, 1) = 12.706, (0.975, 7) = 2.365."""
    if not 0 < p < 1:
        raise ValueError(f"p must be in (0, 1) (got {p})")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    lo, hi = 0.0, 60.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2


def t_interval(xs: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Two-sided Student-t interval of the mean; (NaN, NaN) for fewer than two values."""
    xs = _finite(xs)
    if len(xs) < 2:
        return NAN, NAN
    m, half = mean(xs), t_quantile(0.5 + level / 2, len(xs) - 1) * sd(xs) / math.sqrt(len(xs))
    return m - half, m + half


def bootstrap_interval(xs: Sequence[float], level: float = 0.95, resamples: int = 10000,
                       seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean (resampling the values with replacement, seeded);
    (NaN, NaN) for fewer than two values. Narrower than the t-interval for few seeds: prefer t there."""
    xs = _finite(xs)
    if len(xs) < 2:
        return NAN, NAN
    rng = random.Random(seed)
    n = len(xs)
    means = sorted(sum(rng.choice(xs) for _ in range(n)) / n for _ in range(resamples))
    lo_i = int(math.floor((1 - level) / 2 * resamples))
    hi_i = int(math.ceil((1 + level) / 2 * resamples)) - 1
    return means[lo_i], means[min(hi_i, resamples - 1)]


def paired_differences(arm: Mapping[int, float], baseline: Mapping[int, float]) -> dict[int, float]:
    """{seed: arm - baseline} for the seeds both have with finite values, in seed order."""
    out = {}
    for s in sorted(set(arm) & set(baseline)):
        a, b = arm[s], baseline[s]
        if a is not None and b is not None and not (math.isnan(a) or math.isnan(b)):
            out[s] = float(a) - float(b)
    return out


def t_test_p(xs: Sequence[float]) -> float:
    """Two-sided one-sample Student-t p-value of mean 0 (the paired t-test on differences); NaN below 2
    values. Example: [1, 2, 3] -> t = 3.46, 2 df, p = 0.074."""
    xs = _finite(xs)
    if len(xs) < 2:
        return NAN
    m, s = mean(xs), sd(xs)
    if s == 0:
        return 1.0 if m == 0 else 0.0
    return min(1.0, 2 * (1 - t_cdf(abs(m) / (s / math.sqrt(len(xs))), len(xs) - 1)))


def holm(ps: Mapping) -> dict:
    """Holm's step-down adjusted p-values for a family of tests ({key: p} -> {key: adjusted p}): the
    i-th smallest of m finite p-values is multiplied by m - i + 1, kept non-decreasing, capped at 1;
    NaN stays NaN and is not counted in m. Example: {a: .005, b: .01, c: .03, d: .04} -> .02, .03, .06, .06."""
    finite = sorted((p, k) for k, p in ps.items() if p is not None and not math.isnan(p))
    out, running = {k: NAN for k in ps}, 0.0
    for i, (p, k) in enumerate(finite):
        running = max(running, min(1.0, (len(finite) - i) * p))
        out[k] = running
    return out


def summarise_differences(diffs: Sequence[float], level: float = 0.95, seed: int = 0) -> dict:
    """n, mean, sd, t and bootstrap intervals, the paired t-test's p, seeds ahead / behind, and a plain verdict:
    `ahead` or `behind` when the t-interval excludes 0, `noise` when it holds 0, `too few seeds` below 2."""
    xs = _finite(diffs)
    t_lo, t_hi = t_interval(xs, level)
    b_lo, b_hi = bootstrap_interval(xs, level, seed=seed)
    if len(xs) < 2:
        verdict = "too few seeds"
    elif t_lo > 0:
        verdict = "ahead"
    elif t_hi < 0:
        verdict = "behind"
    else:
        verdict = "noise"
    return {"n": len(xs), "mean": mean(xs), "sd": sd(xs), "t_lo": t_lo, "t_hi": t_hi, "boot_lo": b_lo,
            "boot_hi": b_hi, "p": t_test_p(xs), "ahead": sum(x > 0 for x in xs), "behind": sum(x < 0 for x in xs),
            "level": level, "verdict": verdict}


def area_under_curve(x: Sequence[float], y: Sequence[float]) -> float:
    """Trapezoid area under y(x) divided by the x span: the curve's mean height (NaN with < 2 points).

    Example: x [0, 10, 20], y [0.2, 0.4, 0.4] -> (3 + 4) / 20 = 0.35.
    """
    pts = [(float(a), float(b)) for a, b in zip(x, y) if a is not None and b is not None
           and not (math.isnan(a) or math.isnan(b))]
    if len(pts) < 2 or pts[-1][0] == pts[0][0]:
        return NAN
    area = sum((x1 - x0) * (y0 + y1) / 2 for (x0, y0), (x1, y1) in zip(pts, pts[1:]))
    return area / (pts[-1][0] - pts[0][0])


def first_reaching(x: Sequence[float], y: Sequence[float], target: float) -> float:
    """The first x whose y >= target (NaN when none does, or the target is NaN)."""
    if target is None or math.isnan(target):
        return NAN
    for a, b in zip(x, y):
        if b is not None and not math.isnan(b) and b >= target - 1e-12:
            return float(a)
    return NAN


def replay_vs_target(counts: Mapping[int, float], weights: Mapping[int, float]) -> list[dict]:
    """Per bucket k: replayed count, its share of all replays, and the target share (weights normalised
    over the buckets listed; 0 for a bucket with no weight, e.g. question-uniform replay of a question whose
    latest group got none right). Shares below target mean the bucket was often empty or short."""
    total, wsum = sum(counts.values()), sum(weights.values())
    return [{"k": k, "replayed": counts.get(k, 0), "share": counts.get(k, 0) / total if total else NAN,
             "target": weights.get(k, 0.0) / wsum if wsum else NAN} for k in sorted(set(counts) | set(weights))]


def mcnemar_exact(b: int, c: int) -> float:
    """Exact two-sided McNemar test for paired yes/no outcomes: b, c = the two kinds of discordant
    pairs; p = P(a Binomial(b + c, 1/2) count at least as far from (b + c)/2 as observed)."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2 ** n
    return min(1.0, 2 * tail)
