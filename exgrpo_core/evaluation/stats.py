"""Statistics of a comparison between arms over paired seeds (issues 15, 33): numbers in and out.

Seeds pair the arms: arm A's seed s and the baseline's seed s share the starting model, the data
order and the sampling seed, so the per-seed difference removes what the seed does to both. Only
seeds present in both arms are used (an interrupted driver never leaves an unmatched run in the
statistics). That pairing is the only logic of our own here; the distributions and tests are
scipy.stats': the Student-t interval and paired t-test (`ttest_1samp` on the differences), an exact
sign-flip permutation test (`permutation_test`), a seeded percentile bootstrap over seeds
(`bootstrap` on the per-seed differences, i.e. resampling whole seed pairs), exact McNemar and the
censored sign test (`binomtest`). Holm's correction is written out: scipy has none
(`false_discovery_control` is Benjamini-Hochberg / -Yekutieli, which bounds the false discovery rate,
not the family-wise error Holm bounds).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from scipy import stats as sps

NAN = float("nan")
MIN_BOOTSTRAP_SEEDS = 8  # below this a percentile bootstrap over seeds under-covers: flagged in every table
SIGN_FLIP_EXACT_MAX = 16  # up to 2^16 sign patterns enumerated; more seeds: a seeded Monte Carlo p
SIGN_FLIP_RESAMPLES = 100_000


def _finite(xs) -> list[float]:
    return [float(x) for x in xs if x is not None and not math.isnan(float(x))]


def mean(xs: Sequence[float]) -> float:
    xs = _finite(xs)
    return float(np.mean(xs)) if xs else NAN


def _constant(xs: list[float]) -> bool:
    """All values equal up to rounding (a t statistic would be rounding noise divided by ~0)."""
    return max(xs) - min(xs) <= 1e-12 * max(1.0, max(abs(x) for x in xs))


def sd(xs: Sequence[float]) -> float:
    """Sample standard deviation (n - 1); NaN for fewer than two values."""
    xs = _finite(xs)
    return float(np.std(xs, ddof=1)) if len(xs) >= 2 else NAN


def t_quantile(p: float, df: float) -> float:
    """x with P(T_df <= x) = p (scipy.stats.t.ppf); e.g. t_quantile(0.975, 7) = 2.365."""
    if not 0 < p < 1:
        raise ValueError(f"p must be in (0, 1) (got {p})")
    return float(sps.t.ppf(p, df))


def t_interval(xs: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Two-sided Student-t interval of the mean (scipy's ttest_1samp); (NaN, NaN) below two values, the
    point itself for constant values."""
    xs = _finite(xs)
    if len(xs) < 2:
        return NAN, NAN
    if _constant(xs):
        return xs[0], xs[0]
    ci = sps.ttest_1samp(xs, 0.0).confidence_interval(level)
    return float(ci.low), float(ci.high)


def bootstrap_interval(xs: Sequence[float], level: float = 0.95, resamples: int = 10000,
                       seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean (scipy.stats.bootstrap, seeded); on paired differences this
    resamples whole seed pairs. (NaN, NaN) below two values. Under-covers for few seeds: see MIN_BOOTSTRAP_SEEDS."""
    xs = _finite(xs)
    if len(xs) < 2:
        return NAN, NAN
    if _constant(xs):
        return xs[0], xs[0]
    ci = sps.bootstrap((np.asarray(xs),), np.mean, n_resamples=resamples, confidence_level=level,
                       method="percentile", rng=np.random.default_rng(seed)).confidence_interval
    return float(ci.low), float(ci.high)


def paired_differences(arm: Mapping[int, float], baseline: Mapping[int, float]) -> dict[int, float]:
    """{seed: arm - baseline} for the seeds both have with finite values, in seed order."""
    out = {}
    for s in sorted(set(arm) & set(baseline)):
        a, b = arm[s], baseline[s]
        if a is not None and b is not None and not (math.isnan(a) or math.isnan(b)):
            out[s] = float(a) - float(b)
    return out


def t_test_p(xs: Sequence[float]) -> float:
    """Two-sided paired t-test p of mean difference 0 (scipy.stats.ttest_1samp); NaN below 2 values,
    0 or 1 for constant differences. Example: [1, 2, 3] -> t = 3.46, 2 df, p = 0.074."""
    xs = _finite(xs)
    if len(xs) < 2:
        return NAN
    if _constant(xs):
        return 1.0 if xs[0] == 0 else 0.0
    return float(sps.ttest_1samp(xs, 0.0).pvalue)


def sign_flip_p(xs: Sequence[float], seed: int = 0) -> tuple[float, bool]:
    """(p, exact): two-sided sign-flip permutation test of mean difference 0 (scipy.stats.permutation_test,
    one sample): under no effect each seed's difference is as likely with either sign. Exact (all 2^n sign
    patterns) up to SIGN_FLIP_EXACT_MAX seeds, else seeded Monte Carlo. Example: [1, 2, 3] -> 2/8 = 0.25."""
    xs = _finite(xs)
    if len(xs) < 2:
        return NAN, True
    if not any(xs):
        return 1.0, True
    if _constant(xs):  # one sign pattern and its mirror reach the observed mean
        return min(1.0, 2 / 2 ** len(xs)), len(xs) <= SIGN_FLIP_EXACT_MAX
    exact = len(xs) <= SIGN_FLIP_EXACT_MAX
    res = sps.permutation_test((np.asarray(xs),), lambda x, axis: np.mean(x, axis=axis), vectorized=True,
                               permutation_type="samples", n_resamples=np.inf if exact else SIGN_FLIP_RESAMPLES,
                               rng=np.random.default_rng(seed))
    return float(res.pvalue), exact


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


def no_statistic_cause(diffs: Sequence[float]) -> str | None:
    """Why no t-interval or t-test can be computed from these paired differences; None when one can.
    Below two values there is no spread to estimate; with zero variance (every seed differs by the same
    amount) the t statistic divides by zero. Example: [0.1, 0.1] -> "zero variance: ...differs by +0.100"."""
    xs = _finite(diffs)
    if len(xs) < 2:
        return f"{len(xs)} paired seed{'' if len(xs) == 1 else 's'} with a value: a statistic needs 2"
    if _constant(xs):
        return f"zero variance: every paired seed differs by {xs[0]:+.3f}"
    return None


def summarise_differences(diffs: Sequence[float], level: float = 0.95, seed: int = 0) -> dict:
    """n, mean, sd, the t-interval and its half-width, the bootstrap interval (`boot_few`: fewer than
    MIN_BOOTSTRAP_SEEDS seeds), the paired t-test's p and the sign-flip p, seeds ahead / behind, and the
    uncorrected verdict: `ahead` / `behind` when the t-interval excludes 0, `null` when it holds 0 (then
    `bound`: |difference| < bound at `level`, the larger end of the interval), `no statistic` when
    `no_statistic_cause` names a `cause` (fewer than 2 values, zero variance: intervals and p (t) NaN)."""
    xs = _finite(diffs)
    cause = no_statistic_cause(xs)
    t_lo, t_hi = (NAN, NAN) if cause else t_interval(xs, level)
    b_lo, b_hi = (NAN, NAN) if cause else bootstrap_interval(xs, level, seed=seed)
    p_flip, exact = sign_flip_p(xs, seed)
    if cause:
        verdict = "no statistic"
    elif t_lo > 0:
        verdict = "ahead"
    elif t_hi < 0:
        verdict = "behind"
    else:
        verdict = "null"
    return {"n": len(xs), "mean": mean(xs), "sd": sd(xs), "t_lo": t_lo, "t_hi": t_hi,
            "half_width": (t_hi - t_lo) / 2, "bound": max(abs(t_lo), abs(t_hi)), "boot_lo": b_lo, "boot_hi": b_hi,
            "boot_few": len(xs) < MIN_BOOTSTRAP_SEEDS, "p": NAN if cause else t_test_p(xs), "p_signflip": p_flip,
            "signflip_exact": exact, "ahead": sum(x > 0 for x in xs), "behind": sum(x < 0 for x in xs),
            "level": level, "verdict": verdict, "cause": cause}


def censored_pair_scores(pairs: Mapping[int, tuple[float, float, float, float]]) -> dict[int, int]:
    """Gehan's within-pair score for a time-to-target with censoring: {seed: +1 arm reached it first,
    -1 baseline first, 0 undetermined} from (arm time, arm horizon, baseline time, baseline horizon), a time
    NaN when that run never reached the target. Both runs are censored at the pair's common horizon (the
    smaller of the two: a run that stopped earlier cannot show the other was slower), so a seed where only
    one arm reached the target counts for that arm instead of being dropped; both censored, or a tie: 0."""
    out = {}
    for s, (ta, ca, tb, cb) in sorted(pairs.items()):
        h = min((c for c in (ca, cb) if c is not None and not math.isnan(c)), default=math.inf)
        a = ta is not None and not math.isnan(ta) and ta <= h
        b = tb is not None and not math.isnan(tb) and tb <= h
        out[s] = (0 if not (a or b) else 1 if not b else -1 if not a else int(np.sign(tb - ta)))
    return out


def censored_sign_test(scores: Mapping[int, int]) -> dict:
    """The paired Gehan (censored sign) test: under no effect each determined pair (score +1 or -1) goes
    either way with probability 1/2; exact two-sided binomial p (scipy.stats.binomtest). Counts too."""
    first, later = sum(v > 0 for v in scores.values()), sum(v < 0 for v in scores.values())
    p = float(sps.binomtest(first, first + later, 0.5).pvalue) if first + later else NAN
    return {"earlier": first, "later": later, "undetermined": len(scores) - first - later, "p": p}


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
    pairs; the binomial test of b out of b + c at 1/2 (scipy.stats.binomtest)."""
    return float(sps.binomtest(b, b + c, 0.5).pvalue) if b + c else 1.0
