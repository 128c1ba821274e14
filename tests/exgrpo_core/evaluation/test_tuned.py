"""Tuned-per-arm comparisons (exgrpo_core/evaluation/tuned.py) on constructed grids with known answers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from exgrpo_core.evaluation import tuned

RATES = [1e-5, 1e-4, 1e-3]


def test_best_rate_is_the_highest_mean_and_a_tie_goes_to_the_lower_rate():
    area = [[0.1, 0.3], [0.4, 0.2], [0.5, 0.4]]  # means 0.2, 0.3, 0.45
    assert tuned.best_rate_index(area) == 2
    assert tuned.best_rate_index([[0.25, 0.25], [0.125, 0.375], [0.1, 0.1]]) == 0


def test_tuned_difference_compares_each_arm_at_its_own_best_rate():
    a = np.array([[0.50, 0.52], [0.40, 0.42]])  # best: rate 0, mean 0.51
    b = np.array([[0.30, 0.30], [0.45, 0.47]])  # best: rate 1, mean 0.46
    assert tuned.tuned_difference(a, b) == pytest.approx(0.05)
    final_a, final_b = a + 0.1, b - 0.1  # another measure, read at the rates chosen by area
    assert tuned.tuned_difference(a, b, final_a, final_b) == pytest.approx(0.25)


def test_a_constant_difference_gives_a_point_interval_and_the_smallest_p():
    rng = np.random.default_rng(1)
    b = rng.normal(0.4, 0.02, size=(3, 12))
    out = tuned.tuned_bootstrap(b + 0.03, b, resamples=999)  # A is B shifted: same best rate in every resample
    assert out["diff"] == pytest.approx(0.03) and out["lo"] == pytest.approx(0.03) and out["hi"] == pytest.approx(0.03)
    assert out["p"] == pytest.approx(2 / 1000) and out["share_best_a"] == out["share_best_b"]


def test_the_winners_curse_widens_the_interval_beyond_the_fixed_best_one():
    # Arm A: rate 0 is steady at 0.500; rate 1 is noisy around 0.495 (it loses on the full sample) but wins
    # in many resamples. B is steady. Re-choosing A's best rate per resample lets those wins into the
    # interval; the naive interval, with A's rate fixed at the full sample's choice, is near a point.
    n = 24
    noise = np.tile([0.03, -0.03], n // 2)
    a = np.vstack([np.full(n, 0.500), 0.495 + noise * np.linspace(0.2, 1.8, n)])
    b = np.vstack([np.full(n, 0.480), np.full(n, 0.470)])
    assert tuned.best_rate_index(a) == 0
    draws = tuned.seed_draws(n, 4000)
    curse, naive = tuned.tuned_bootstrap(a, b, draws=draws), tuned.fixed_best_bootstrap(a, b, draws=draws)
    assert naive["lo"] == pytest.approx(0.02) and naive["hi"] == pytest.approx(0.02)
    assert curse["diff"] == pytest.approx(0.02) and curse["hi"] > 0.025
    assert 0.05 < curse["share_best_a"][1] < 0.95


def test_the_shared_rate_is_chosen_by_one_arm_inside_every_resample():
    a = np.array([[0.50] * 4, [0.60] * 4])
    b = np.array([[0.40] * 4, [0.55] * 4])
    at_b_best = tuned.shared_best_bootstrap(b, a, b, resamples=200)
    assert at_b_best["rate"] == 1 and at_b_best["diff"] == pytest.approx(0.05) and at_b_best["share_rate"] == [0, 1]
    fixed = tuned.rate_bootstrap(a, b, 0, resamples=200)
    assert fixed["diff"] == pytest.approx(0.10) and fixed["lo"] == pytest.approx(0.10)


def test_equivalence_factor_is_exact_on_a_log_linear_curve():
    # B's area rises by 0.1 per decade: 0.3, 0.4, 0.5; A at 1e-5 matches B at 10**-4.7 ~ 2e-5: factor 10**0.3.
    b = np.array([[0.3] * 3, [0.4] * 3, [0.5] * 3])
    a = np.array([[0.33] * 3, [0.45] * 3, [0.6] * 3])
    rows = tuned.equivalence_factors(RATES, a, b, resamples=50)
    assert rows[0]["factor"] == pytest.approx(10 ** 0.3) and rows[1]["factor"] == pytest.approx(10 ** 0.5)
    assert math.isnan(rows[2]["factor"]) and rows[2]["defined_share"] == 0  # above B's best: no B rate matches
    assert rows[0]["lo"] == pytest.approx(10 ** 0.3) and rows[0]["defined_share"] == 1


def test_equivalence_rate_uses_only_the_rising_branch_up_to_the_best_rate():
    means = [0.3, 0.5, 0.2]  # collapses past its best: 0.25 matches on the rising side only
    assert tuned.equivalence_rate(RATES, means, 0.4) == pytest.approx(10 ** -4.5)
    assert math.isnan(tuned.equivalence_rate(RATES, means, 0.25))
    assert tuned.equivalence_rate(RATES, [0.5, 0.4, 0.3], 0.5) == pytest.approx(1e-5)


def test_bootstrap_p_and_the_decision_rule():
    assert tuned.bootstrap_p(np.array([1.0, 2.0, -1.0, 3.0])) == pytest.approx(2 * 2 / 5)
    assert tuned.verdict(0.001, 0.02, 0.005) == "ahead"
    assert tuned.verdict(0.001, 0.004, 0.005) == "ahead, by less than 0.005"
    assert tuned.verdict(-0.01, 0.004, 0.005) == "no practically relevant gain"
    assert tuned.verdict(-0.01, 0.006, 0.005) == "inconclusive"


def test_arms_on_other_seeds_are_refused():
    with pytest.raises(ValueError, match="paired by seed"):
        tuned.tuned_bootstrap(np.zeros((3, 4)), np.zeros((3, 5)))
    with pytest.raises(ValueError, match="values\\[rate, seed\\]"):
        tuned.best_rate_index([0.1, 0.2])
