"""Reward-spread buckets (paper v2 §5.3) and the group rules they feed; 0/1 groups keep the count rule."""

from __future__ import annotations

import random

import pytest

from exgrpo_core.algorithm import selection, spread
from exgrpo_core.types import GroupResult, Rollout


def _group(rewards, replayed=0):
    return GroupResult("q", [Rollout("q", [1], [2], [0.0], f"r{i}", False, 0, reward=r) for i, r in enumerate(rewards)],
                       is_replay=bool(replayed), replayed=replayed)


def test_the_normalised_spread_sets_the_bucket():
    assert spread.spread_buckets([0, .1, .2, .4], 8, .01) == [0, 2, 4, 8]
    assert spread.spread_buckets([0.05, 0.05], 8, .01) == [8, 8]  # equal non-zero spreads: each the most spread
    assert spread.spread_buckets([0.0, 0.0], 8, .01) == [0, 0]
    assert spread.spread_buckets([0.0, 1.0], 8, 0.2) == [2, 8]  # eps floors the normalised spread
    assert spread.spread_buckets([0, 0.0625, 1], 8, .01) == [0, 1, 8]  # 0.5 rounds up
    assert spread.reward_spread([0.0, 1.0]) == 0.5


def test_continuous_groups_collect_above_the_mean_and_retire_only_when_all_are_one():
    g = _group([0.2, 0.4, 0.9, 0.6])
    spread.assign([g, _group([1.0, 1.0, 1.0, 1.0])], 4, 0.01)
    assert g.continuous and g.k == 4 and [g.succeeded(r) for r in g.rollouts] == [False, False, True, True]
    assert g.successes == 2 and not g.solved
    solved = _group([1.0] * 4)
    solved.bucket = 0
    assert solved.solved and solved.successes == 0
    mixed = _group([0.1, 0.3, 0.8], replayed=1)
    mixed.bucket = 2
    assert mixed.successes == 1 and mixed.size == 4  # the mean of its fresh rewards, the replayed one not counted


def test_binary_groups_keep_the_count_rules():
    rng = random.Random(0)
    for _ in range(200):
        K, replayed = rng.choice([2, 4, 8]), rng.choice([0, 1])
        rewards = [float(rng.random() < 0.5) for _ in range(K - replayed)]
        g = _group(rewards, replayed)
        k = sum(1 for r in rewards if r > 0) + replayed
        assert (g.k, g.successes, g.solved) == (k, k, k == K)
        assert [g.succeeded(r) for r in g.rollouts] == [r > 0 for r in rewards]


def test_bucket_k_is_drawable_only_with_continuous_rewards():
    binary = selection.bucket_weights(8, "gaussian", 1.0, "count")
    continuous = selection.bucket_weights(8, "gaussian", 1.0, "count", top=True)
    assert sorted(binary) == list(range(1, 8)) and sorted(continuous) == list(range(1, 9))
    assert {k: continuous[k] for k in binary} == binary and continuous[8] > 0
