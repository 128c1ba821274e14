"""DAPO dynamic sampling (Yu et al. 2025, §3.2; the replay lab's arm `rollout.dynamic_sampling`): a fresh group
whose rewards are all equal has zero group-relative advantage everywhere, so it is dropped from the training
batch and the batch is refilled with further fresh questions. Pure functions on rewards; the loop draws."""

from __future__ import annotations

from typing import Sequence


def uninformative(rewards: Sequence[float]) -> bool:
    """DAPO's filter: True when every reward of the group is equal (all 0 / all 1; continuous: spread 0)."""
    if not rewards:
        raise ValueError("a group needs at least one reward")
    return max(rewards) == min(rewards)


def dropped(groups: dict[str, Sequence[float]]) -> list[str]:
    """The questions (in the given order) whose groups dynamic sampling drops from the training batch."""
    return [uid for uid, rewards in groups.items() if uninformative(rewards)]
