"""Buckets for continuous rewards (paper v2 §5.3, docs/rewards.md): a question's bucket is the spread of
its group's rewards, min-max normalised over the step's batch, instead of its correct count.

With 0/1 rewards nothing here runs: buckets stay the correct count k (the paper's main rule).
"""

from __future__ import annotations

import math
from typing import Sequence

from exgrpo_core.types import GroupResult


def reward_spread(rewards: Sequence[float]) -> float:
    """sigma_q: the standard deviation of one group's rewards (population, ddof 0)."""
    if not rewards:
        raise ValueError("reward_spread needs at least one reward")
    mean = sum(rewards) / len(rewards)
    return math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))


def spread_buckets(spreads: Sequence[float], group_size: int, eps: float) -> list[int]:
    """Paper v2 §5.3: sigma~ = max((sigma_q - sigma_min) / (sigma_max - sigma_min), eps) over the batch,
    bucket = round(sigma~ * K) (halves up), in 0..K.

    When every question of the batch has the same spread, sigma~ is eps for a spread of 0 (nothing to
    learn from) and 1 otherwise (each is the batch's most spread question).
    Example: spreads [0, .1, .2, .4], K = 8, eps = .01 -> sigma~ [.01, .25, .5, 1] -> [0, 2, 4, 8].
    """
    if group_size < 2:
        raise ValueError(f"group_size must be >= 2, got {group_size}")
    if not spreads:
        return []
    lo, hi = min(spreads), max(spreads)
    out = []
    for s in spreads:
        if hi > lo:
            x = (s - lo) / (hi - lo)
        else:
            x = 0.0 if hi == 0 else 1.0
        out.append(int(math.floor(max(x, eps) * group_size + 0.5)))
    return out


def assign(groups: list[GroupResult], group_size: int, eps: float) -> None:
    """Set each group's reward-spread bucket from its fresh rewards (a mixed group's K-1: the replayed
    trajectory is chosen after the buffer update), normalised over these groups."""
    spreads = [reward_spread([r.reward for r in g.rollouts]) for g in groups]
    for g, b in zip(groups, spread_buckets(spreads, group_size, eps)):
        g.bucket = b
