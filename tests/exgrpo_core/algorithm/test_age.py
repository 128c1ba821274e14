"""The replay lab's age rules: the age cap leaves old candidates out, the half-life weighs the draw."""

from __future__ import annotations

import random
from collections import Counter

from exgrpo_core.algorithm import age, selection


def test_the_factor_halves_every_half_life_and_the_cap_is_inclusive():
    assert age.age_factor(4, 2.0) == 0.25 and age.age_factor(7, None) == 1.0
    assert age.young_enough(8, 8) and not age.young_enough(9, 8) and age.young_enough(10**6, None)


def test_without_a_half_life_the_draw_is_exgrpo_s_on_the_young_enough_questions():
    buckets = {1: [("a", 1), ("b", 9)], 2: [("c", 3), ("d", 2), ("e", 12)]}
    w = {1: 1.0, 2: 3.0}
    got = age.sample_aged_questions(buckets, 5, w, random.Random(4), max_age=8)
    assert got == selection.sample_questions({1: ["a"], 2: ["c", "d"]}, 5, w, random.Random(4))
    assert sorted(got) == ["a", "c", "d"]  # b and e are older than 8 steps: never drawn
    plain = age.sample_aged_questions(buckets, 3, w, random.Random(2))
    assert plain == selection.sample_questions({k: [u for u, _ in v] for k, v in buckets.items()}, 3, w,
                                               random.Random(2))


def test_a_question_is_drawn_in_proportion_to_its_bucket_weight_times_the_decay():
    rng = random.Random(0)
    n = 6000
    inside = Counter(age.sample_aged_questions({1: [("young", 0), ("old", 2)]}, 1, {1: 1.0}, rng, half_life=1.0)[0]
                     for _ in range(n))
    assert abs(inside["young"] / n - 0.8) < 0.02  # 1 : 0.25
    across = Counter(age.sample_aged_questions({1: [("a", 0)], 2: [("b", 1)]}, 1, {1: 1.0, 2: 1.0}, rng,
                                               half_life=1.0)[0] for _ in range(n))
    assert abs(across["a"] / n - 2 / 3) < 0.02  # bucket weights 1 x 1 and 1 x 0.5
    per_q = Counter(age.sample_aged_questions({1: [("a", 0)], 2: [("b", 0), ("c", 0), ("d", 2)]}, 1,
                                              {1: 1.0, 2: 1.0}, rng, per_question=True, half_life=1.0)[0]
                    for _ in range(n))
    assert abs(per_q["d"] / n - 0.25 / 3.25) < 0.015  # per question: w(k) x d_q over all questions
    two = age.sample_aged_questions({1: [("a", 0), ("b", 5)]}, 3, {1: 1.0}, random.Random(1), half_life=2.0)
    assert sorted(two) == ["a", "b"]  # without replacement, the pool exhausted
