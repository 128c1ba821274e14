"""Question weighting, bucket sampling, trajectory choice, retirement and delayed start.

Run: .venv/bin/python -m pytest tests/exgrpo_core/test_selection.py -q
"""

import math
import random
from collections import Counter

import pytest
import torch
from scipy.stats import chisquare

from exgrpo_core.algorithm import selection as S


def _normalise(w):
    total = sum(w.values())
    return {k: v / total for k, v in w.items()}


# ---------------------------------------------------------------- bucket weights
def test_gaussian_count_unit_matches_spec_probabilities_for_k8():
    # s = 1/8 in accuracy -> w_k = exp(-(k/8 - 1/2)^2 / (2/64)) = exp(-(k - 4)^2 / 2):
    # [.0111, .1353, .6065, 1, .6065, .1353, .0111], sum 2.5066 -> .004/.054/.242/.399/.242/.054/.004
    p = _normalise(S.bucket_weights(8, "gaussian", 1.0, "count"))
    assert list(p) == [1, 2, 3, 4, 5, 6, 7]
    assert [round(v, 3) for v in p.values()] == [0.004, 0.054, 0.242, 0.399, 0.242, 0.054, 0.004]


def test_gaussian_accuracy_unit_is_nearly_uniform():
    # sigma = 1 in accuracy units (paper text taken literally): probabilities within .137-.147
    p = _normalise(S.bucket_weights(8, "gaussian", 1.0, "accuracy"))
    assert 0.136 < min(p.values()) < max(p.values()) < 0.148


def test_ablation_weightings_match_naive_formulas():
    for k, w in S.bucket_weights(6, "linear", 1.0, "count").items():
        assert w == pytest.approx(k / 6)
    for k, w in S.bucket_weights(6, "sqrt", 1.0, "count").items():
        assert w == pytest.approx(math.sqrt(k / 6))
    assert set(S.bucket_weights(6, "bucket_uniform", 1.0, "count").values()) == {1.0}
    for k, w in S.bucket_weights(16, "gaussian", 2.0, "count").items():  # s = 2/16
        assert w == pytest.approx(math.exp(-((k / 16 - 0.5) ** 2) / (2 * (2 / 16) ** 2)))


def test_gaussian_is_symmetric_and_peaks_at_half():
    w = S.bucket_weights(10, "gaussian", 1.5, "count")
    assert all(w[k] == pytest.approx(w[10 - k]) for k in w)
    assert max(w, key=w.get) == 5


@pytest.mark.parametrize("args, match", [((1, "gaussian", 1.0, "count"), "group_size"),
                                         ((8, "cubic", 1.0, "count"), "unknown question weighting"),
                                         ((8, "gaussian", 1.0, "bits"), "sigma_unit"),
                                         ((8, "gaussian", 0.0, "count"), "sigma")])
def test_bucket_weights_reject_bad_input(args, match):
    with pytest.raises(S.SelectionError, match=match):
        S.bucket_weights(*args)


# ---------------------------------------------------------------- question sampling
def _pool(sizes):
    return {k: [f"q{k}_{i}" for i in range(n)] for k, n in sizes.items()}


def test_sampled_bucket_frequencies_follow_the_weights_chi_square():
    weights = S.bucket_weights(8, "gaussian", 1.0, "count")
    buckets = _pool({k: 5000 for k in weights})  # no bucket can run out: draws are multinomial
    picked = S.sample_questions(buckets, 5000, weights, random.Random(0))
    assert len(set(picked)) == 5000
    counts = Counter(int(q[1:].split("_")[0]) for q in picked)
    p = _normalise(weights)
    _, pvalue = chisquare([counts[k] for k in p], [5000 * p[k] for k in p])
    assert pvalue > 1e-3


def test_question_uniform_draws_every_pooled_question_alike_and_bucket_uniform_every_bucket():
    """The paper's "w/o question selection" is uniform over questions, not over buckets."""
    buckets = _pool({1: 1, 4: 99})  # one question alone in bucket 1
    w = S.bucket_weights(8, "question_uniform", 1.0, "count")
    assert set(w.values()) == {1.0} and "question_uniform" in S.PER_QUESTION
    lone = [S.sample_questions(buckets, 1, w, random.Random(s), per_question=True)[0] == "q1_0"
            for s in range(3000)]
    by_bucket = [S.sample_questions(buckets, 1, S.bucket_weights(8, "bucket_uniform", 1.0, "count"),
                                    random.Random(s))[0] == "q1_0" for s in range(3000)]
    assert 10 <= sum(lone) <= 55  # 1/100 of 3000 = 30
    assert 1350 <= sum(by_bucket) <= 1650  # 1/2
    whole = S.sample_questions(buckets, 100, w, random.Random(0), per_question=True)
    assert sorted(whole) == sorted(q for qs in buckets.values() for q in qs)  # without replacement


def test_uniform_inside_a_bucket():
    picked = [S.sample_questions(_pool({3: 4}), 1, {3: 1.0}, random.Random(s))[0] for s in range(4000)]
    _, pvalue = chisquare(list(Counter(picked).values()))
    assert len(Counter(picked)) == 4 and pvalue > 1e-3


def test_exhausted_bucket_share_goes_to_others_by_weight():
    # bucket 1 (weight 5) holds 2 questions; buckets 2, 3 (weights 1, 2) hold plenty.
    # Both bucket-1 questions are taken early; the other 598 draws split 1:2 between buckets 2 and 3.
    buckets = _pool({1: 2, 2: 1000, 3: 1000})
    picked = S.sample_questions(buckets, 600, {1: 5.0, 2: 1.0, 3: 2.0}, random.Random(1))
    counts = Counter(q.split("_")[0] for q in picked)
    assert counts["q1"] == 2 and len(picked) == 600
    _, pvalue = chisquare([counts["q2"], counts["q3"]], [598 / 3, 2 * 598 / 3])
    assert pvalue > 1e-3


def test_exhausted_pool_returns_everything_once():
    buckets = _pool({1: 3, 4: 2, 7: 1, 0: 5})  # bucket 0 has no weight -> never drawn
    weights = S.bucket_weights(8, "gaussian", 1.0, "count")
    picked = S.sample_questions(buckets, 50, weights, random.Random(2))
    assert sorted(picked) == sorted(buckets[1] + buckets[4] + buckets[7])
    assert S.sample_questions({}, 3, weights, random.Random(0)) == []
    assert S.sample_questions(buckets, 0, weights, random.Random(0)) == []


def test_zero_weight_buckets_are_never_drawn():
    picked = S.sample_questions(_pool({1: 10, 2: 10}), 20, {1: 0.0, 2: 1.0}, random.Random(3))
    assert sorted(picked) == sorted(_pool({2: 10})[2])


def test_sampling_is_deterministic_given_rng_and_leaves_input_alone():
    buckets = _pool({1: 20, 2: 20, 3: 20})
    before = {k: list(v) for k, v in buckets.items()}
    w = {1: 1.0, 2: 2.0, 3: 3.0}
    a = S.sample_questions(buckets, 25, w, random.Random(42))
    assert a == S.sample_questions(buckets, 25, w, random.Random(42))
    assert a != S.sample_questions(buckets, 25, w, random.Random(43))
    assert buckets == before


@pytest.mark.parametrize("buckets, weights, n, match", [
    ({1: ["a"], 2: ["a"]}, {1: 1.0, 2: 1.0}, 1, "unique"),
    ({1: ["a", "a"]}, {1: 1.0}, 1, "unique"),
    ({1: ["a"]}, {1: -1.0}, 1, ">= 0"),
    ({1: ["a"]}, {1: float("nan")}, 1, "finite"),
    ({1: ["a"]}, {1: 1.0}, -1, "n must be"),
])
def test_sample_questions_rejects_bad_input(buckets, weights, n, match):
    with pytest.raises(S.SelectionError, match=match):
        S.sample_questions(buckets, n, weights, random.Random(0))


# ---------------------------------------------------------------- trajectory choice
def test_choose_trajectory_modes_and_ties():
    h = [0.7, 0.2, 0.9, 0.2, 0.9]
    rng = random.Random(0)
    assert S.choose_trajectory(h, "argmin", rng) == 1  # tie 1/3 -> first
    assert S.choose_trajectory(h, "argmax", rng) == 2  # tie 2/4 -> first
    assert S.choose_trajectory([0.5], "argmin", rng) == 0


def test_choose_trajectory_matches_naive_argmin_on_random_lists():
    rng = random.Random(5)
    for _ in range(200):
        h = [round(rng.random(), 1) for _ in range(rng.randint(1, 6))]  # rounding makes ties common
        naive = [i for i, x in enumerate(h) if x == min(h)][0]
        assert S.choose_trajectory(h, "argmin", rng) == naive


def test_random_mode_covers_all_candidates_uniformly():
    rng = random.Random(7)
    counts = Counter(S.choose_trajectory([0.1, 0.2, 0.3], "random", rng) for _ in range(3000))
    _, pvalue = chisquare([counts[i] for i in range(3)])
    assert pvalue > 1e-3


@pytest.mark.parametrize("h, mode, match", [([], "argmin", "no candidate"), ([0.1], "lowest", "unknown"),
                                            ([0.1, float("nan")], "argmin", "NaN")])
def test_choose_trajectory_rejects_bad_input(h, mode, match):
    with pytest.raises(S.SelectionError, match=match):
        S.choose_trajectory(h, mode, random.Random(0))


# ---------------------------------------------------------------- retirement, collection, delayed start
def test_retirement_and_collection_rules():
    assert [S.is_retired(k, 8) for k in (0, 7, 8)] == [False, False, True]
    assert [S.is_collectable(k, 1, 7) for k in range(9)] == [False] + [True] * 7 + [False]
    with pytest.raises(S.SelectionError, match="0..8"):
        S.is_retired(9, 8)
    with pytest.raises(S.SelectionError, match="collect_min_k"):
        S.is_collectable(3, 5, 2)


def test_batch_correct_fraction_and_delayed_start():
    # 3 correct of 8 = .375 > .35 -> start; 2 of 8 = .25 -> wait
    assert S.batch_correct_fraction(torch.tensor([[1.0, 0, 0, 1], [0, 1, 0, 0]])) == 0.375
    assert S.batch_correct_fraction([1, 0, 0, 0, 0, 0, 1, 0]) == 0.25
    assert S.replay_should_start(0.375, 0.35) and not S.replay_should_start(0.25, 0.35)
    assert not S.replay_should_start(0.35, 0.35)  # strictly exceeds
    assert S.replay_should_start(0.0, 0.0)  # threshold 0: replay from the start
    with pytest.raises(S.SelectionError, match="at least one"):
        S.batch_correct_fraction([])
    with pytest.raises(S.SelectionError, match="threshold"):
        S.replay_should_start(0.5, 1.5)


# ---------------------------------------------------------------- selection.mu (paper Table 3)
def test_gaussian_mu_quarter_peaks_at_two_successes_for_k8():
    # mu = 0.25, s = 1/8: w_k = exp(-(k/8 - 1/4)^2 / (2/64)) = exp(-(k - 2)^2 / 2), normalised
    raw = {k: math.exp(-((k - 2) ** 2) / 2) for k in range(1, 8)}
    expected = _normalise(raw)  # .257/.424/.257/.057/.005/.000/.000
    p = _normalise(S.bucket_weights(8, "gaussian", 1.0, "count", mu=0.25))
    assert max(p, key=p.get) == 2
    assert p == pytest.approx(expected, rel=1e-12)
    assert [round(v, 3) for v in p.values()] == [0.257, 0.424, 0.257, 0.057, 0.005, 0.0, 0.0]


def test_gaussian_mu_half_reproduces_todays_probabilities():
    p = _normalise(S.bucket_weights(8, "gaussian", 1.0, "count", mu=0.5))
    assert [round(v, 3) for v in p.values()] == [0.004, 0.054, 0.242, 0.399, 0.242, 0.054, 0.004]
    assert p == _normalise(S.bucket_weights(8, "gaussian", 1.0, "count"))


def test_gaussian_mu_in_accuracy_unit_and_other_weightings_ignore_it():
    for k, w in S.bucket_weights(8, "gaussian", 0.3, "accuracy", mu=0.75).items():
        assert w == pytest.approx(math.exp(-((k / 8 - 0.75) ** 2) / (2 * 0.3 ** 2)))
    assert S.bucket_weights(6, "linear", 1.0, "count", mu=0.25) == S.bucket_weights(6, "linear", 1.0, "count")


@pytest.mark.parametrize("mu", [-0.1, 1.5, float("nan")])
def test_gaussian_mu_outside_unit_interval_is_refused(mu):
    with pytest.raises(S.SelectionError, match="mu must be an accuracy in"):
        S.bucket_weights(8, "gaussian", 1.0, "count", mu=mu)
