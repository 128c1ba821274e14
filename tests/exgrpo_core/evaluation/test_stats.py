"""The comparison statistics on inputs whose answers are known by hand or from tables."""

import itertools
import math

import numpy as np
import pytest
import scipy.stats

from exgrpo_core.evaluation import stats


@pytest.mark.parametrize("p, df, expected", [(0.975, 1, 12.706), (0.975, 7, 2.365), (0.975, 15, 2.131),
                                             (0.95, 3, 2.353), (0.5, 4, 0.0)])
def test_t_quantile_matches_the_table(p, df, expected):
    assert stats.t_quantile(p, df) == pytest.approx(expected, abs=1e-3)
    assert stats.t_quantile(1 - p, df) == pytest.approx(-expected, abs=1e-3)


def test_t_interval_by_hand():
    xs = [1.0, 2.0, 3.0, 4.0]  # mean 2.5, sd sqrt(5/3), t(0.975, 3) = 3.1824
    half = 3.1824 * math.sqrt(5 / 3) / 2
    lo, hi = stats.t_interval(xs)
    assert lo == pytest.approx(2.5 - half, abs=1e-3) and hi == pytest.approx(2.5 + half, abs=1e-3)
    assert all(math.isnan(v) for v in stats.t_interval([1.0]))


def test_bootstrap_interval_is_seeded_inside_the_range_and_degenerate_on_constants():
    xs = [0.1, -0.05, 0.2, 0.0, 0.15, 0.05, 0.12, -0.02]
    a = stats.bootstrap_interval(xs, seed=3)
    assert a == stats.bootstrap_interval(xs, seed=3)
    assert min(xs) <= a[0] < stats.mean(xs) < a[1] <= max(xs)
    assert stats.bootstrap_interval([0.3] * 5) == (0.3, 0.3)
    t_lo, t_hi = stats.t_interval(xs)
    assert t_lo < a[0] and a[1] < t_hi  # percentile bootstrap is narrower than t for 8 values


def test_bootstrap_is_scipys_over_seeds_and_flagged_below_eight_seeds():
    xs = [0.1, -0.05, 0.2, 0.0, 0.15, 0.05, 0.12, -0.02]
    ci = scipy.stats.bootstrap((np.array(xs),), np.mean, n_resamples=10000, method="percentile",
                               rng=np.random.default_rng(3)).confidence_interval
    assert stats.bootstrap_interval(xs, seed=3) == pytest.approx((ci.low, ci.high), abs=1e-12)
    assert stats.summarise_differences(xs)["boot_few"] is False
    assert stats.summarise_differences(xs[:7])["boot_few"] is True


def test_t_test_and_quantile_far_in_the_tail():
    # 1 df: the t CDF is 1/2 + atan(t)/pi; [1, 1.001] has mean 1.0005 and standard error 0.0005: t = 2001
    assert stats.t_test_p([1.0, 1.001]) == pytest.approx(2 / math.pi * math.atan(1 / 2001), rel=1e-6)
    assert stats.t_quantile(0.9995, 1) == pytest.approx(math.tan(math.pi * 0.4995), rel=1e-9)  # 636.6


def _sign_flip_by_enumeration(xs):
    obs = abs(sum(xs))
    sums = [abs(sum(s * x for s, x in zip(signs, xs))) for signs in itertools.product((1, -1), repeat=len(xs))]
    return sum(v >= obs - 1e-12 for v in sums) / len(sums)


def test_sign_flip_p_is_exact():
    assert stats.sign_flip_p([1.0, 2.0, 3.0]) == (pytest.approx(0.25), True)  # only +++ and --- reach |6|
    assert stats.sign_flip_p([1.0, 2.0, 3.0, 4.0])[0] == pytest.approx(2 / 16)
    xs = [0.3, -0.1, 0.2, 0.1, 0.05, -0.02, 0.04]
    assert stats.sign_flip_p(xs)[0] == pytest.approx(_sign_flip_by_enumeration(xs))
    assert stats.summarise_differences(xs)["p_signflip"] == pytest.approx(_sign_flip_by_enumeration(xs))
    assert stats.sign_flip_p([0.0, 0.0]) == (1.0, True) and math.isnan(stats.sign_flip_p([0.3])[0])


def test_a_null_gives_the_largest_difference_the_interval_allows():
    s = stats.summarise_differences([0.01, -0.01, 0.004, 0.0])  # mean 0.001, sd by hand below
    sd = math.sqrt(sum((x - 0.001) ** 2 for x in (0.01, -0.01, 0.004, 0.0)) / 3)
    half = 3.182446305 * sd / 2  # t(0.975, 3)
    assert s["verdict"] == "null" and s["half_width"] == pytest.approx(half, rel=1e-6)
    assert s["bound"] == pytest.approx(0.001 + half, rel=1e-6)


def test_censored_pairs_count_a_seed_where_only_one_arm_reached_the_target():
    nan = math.nan  # (arm time, arm horizon, baseline time, baseline horizon)
    pairs = {0: (100, 1000, 200, 1000),  # both reached, arm first: +1
             1: (300, 1000, nan, 1000),  # only the arm: +1 (dropped by a complete-case test)
             2: (nan, 350, 400, 1000),  # baseline at 400, but the arm stopped at 350: undetermined
             3: (nan, 1000, nan, 1000),  # neither: 0
             4: (500, 1000, 250, 1000),  # baseline first: -1
             5: (100, 1000, nan, 1000)}
    scores = stats.censored_pair_scores(pairs)
    assert scores == {0: 1, 1: 1, 2: 0, 3: 0, 4: -1, 5: 1}
    test = stats.censored_sign_test(scores)
    assert (test["earlier"], test["later"], test["undetermined"]) == (3, 1, 2)
    assert test["p"] == pytest.approx(10 / 16)  # 3 of 4 one way: (C(4,0) + C(4,1) + C(4,3) + C(4,4)) / 2^4


def test_paired_differences_use_only_matched_finite_seeds():
    arm = {0: 0.5, 1: 0.6, 2: 0.7, 3: float("nan")}
    base = {0: 0.4, 1: 0.65, 3: 0.1, 4: 0.2}
    assert stats.paired_differences(arm, base) == pytest.approx({0: 0.1, 1: -0.05})


def test_summary_verdicts():
    ahead = stats.summarise_differences([0.1, 0.12, 0.09, 0.11])
    assert ahead["verdict"] == "ahead" and ahead["ahead"] == 4 and ahead["t_lo"] > 0
    assert stats.summarise_differences([-0.1, -0.12, -0.09])["verdict"] == "behind"
    noise = stats.summarise_differences([0.1, -0.1, 0.05, -0.04])
    assert noise["verdict"] == "null" and noise["t_lo"] < 0 < noise["t_hi"]
    assert noise["ahead"] == 2 and noise["behind"] == 2 and noise["mean"] == pytest.approx(0.0025)
    one = stats.summarise_differences([0.3])
    assert one["verdict"] == "no statistic" and one["cause"] == "1 paired seed with a value: a statistic needs 2"
    assert stats.summarise_differences([0.1, 0.12])["cause"] is None


def test_zero_variance_is_named_and_has_no_t_test():
    """Every seed differing by the same amount: no spread, so no t-interval or t p (not p = 0 or 1)."""
    for xs, shown in (([0.05, 0.05, 0.05], "+0.050"), ([0.0, 0.0], "+0.000")):
        s = stats.summarise_differences(xs)
        assert s["verdict"] == "no statistic" and s["cause"] == f"zero variance: every paired seed differs by {shown}"
        assert math.isnan(s["p"]) and math.isnan(s["t_lo"]) and math.isnan(s["boot_lo"])
    assert stats.summarise_differences([0.05, 0.05, 0.05])["p_signflip"] == pytest.approx(0.25)  # 2 of 8 patterns


def test_area_under_curve_is_the_mean_height():
    assert stats.area_under_curve([0, 10, 20], [0.2, 0.4, 0.4]) == pytest.approx(0.35)
    assert stats.area_under_curve([0, 5], [0.5, 0.5]) == pytest.approx(0.5)
    assert math.isnan(stats.area_under_curve([3], [0.5]))


def test_first_reaching():
    assert stats.first_reaching([0, 64, 128], [0.2, 0.5, 0.6], 0.5) == 64
    assert math.isnan(stats.first_reaching([0, 64], [0.2, 0.3], 0.5))
    assert math.isnan(stats.first_reaching([0, 64], [0.2, 0.3], float("nan")))


def test_replay_vs_target_shares():
    rows = stats.replay_vs_target({3: 6, 4: 2}, {3: 1.0, 4: 1.0, 5: 2.0})
    assert [(r["k"], r["replayed"], r["share"], r["target"]) for r in rows] == [
        (3, 6, 0.75, 0.25), (4, 2, 0.25, 0.25), (5, 0, 0.0, 0.5)]
    rows = stats.replay_vs_target({0: 1, 3: 3}, {3: 1.0, 4: 1.0})  # a replay from a bucket without weight
    assert [(r["k"], r["replayed"], r["share"], r["target"]) for r in rows] == [
        (0, 1, 0.25, 0.0), (3, 3, 0.75, 0.5), (4, 0, 0.0, 0.5)]


def test_mcnemar_exact_by_hand():
    assert stats.mcnemar_exact(0, 6) == pytest.approx(2 / 64)  # all 6 discordant pairs one way
    assert stats.mcnemar_exact(5, 1) == pytest.approx(2 * 7 / 64)  # (C(6,0) + C(6,1)) / 2^6, two-sided
    assert stats.mcnemar_exact(3, 3) == 1.0 and stats.mcnemar_exact(0, 0) == 1.0


def test_paired_t_test_p_matches_the_textbook_values():
    assert stats.t_test_p([1.0, 2.0, 3.0]) == pytest.approx(0.07418, abs=1e-5)  # t = 3.464, 2 df
    assert stats.t_test_p([0.1, -0.1, 0.05, -0.04]) == pytest.approx(0.95900, abs=1e-5)
    assert stats.t_test_p([0.002, 0.011, -0.004, 0.007, 0.009, 0.001]) == pytest.approx(0.11883, abs=1e-5)
    assert stats.t_test_p([0.2, 0.2]) == 0.0 and stats.t_test_p([0.0, 0.0]) == 1.0
    assert math.isnan(stats.t_test_p([0.3]))
    assert stats.summarise_differences([1.0, 2.0, 3.0])["p"] == pytest.approx(0.07418, abs=1e-5)


def test_holm_steps_down_keeps_order_and_skips_nan():
    got = stats.holm({"a": 0.005, "b": 0.01, "c": 0.03, "d": 0.04, "e": float("nan")})
    assert [got[k] for k in "abcd"] == pytest.approx([0.02, 0.03, 0.06, 0.06])  # m = 4: NaN not counted
    assert math.isnan(got["e"])
    assert stats.holm({"x": 0.4, "y": 0.5}) == pytest.approx({"x": 0.8, "y": 0.8})  # capped monotone
    assert stats.holm({"x": 0.9, "y": 0.6}) == pytest.approx({"x": 1.0, "y": 1.0})
    assert stats.holm({}) == {}
