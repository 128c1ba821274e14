"""Age rules of replay (the replay lab's arms, docs/benchmarks/replay_lab.md): a cap on the age of what is
replayed (`buffer.max_age`) and a draw weight decaying with the age of a question's newest candidate
(`selection.age_half_life`). Age = the current step - the step whose policy sampled the trajectory.
Pure functions on numbers and lists: the store reads the ages.
"""

from __future__ import annotations

import random

from exgrpo_core.algorithm import selection


def age_factor(age: int, half_life: float | None) -> float:
    """Age-decayed priority: 0.5 ** (age / half_life), the factor a question's draw weight is multiplied by
    (1 when half_life is None)."""
    if half_life is None:
        return 1.0
    if not half_life > 0:
        raise selection.SelectionError(f"age half-life must be > 0, got {half_life}")
    return 0.5 ** (max(age, 0) / half_life)


def young_enough(age: int, max_age: int | None) -> bool:
    """`buffer.max_age`: a trajectory sampled more than max_age steps before the current step is never replayed."""
    return max_age is None or age <= max_age


def sample_aged_questions(buckets: dict[int, list[tuple[str, int]]], n: int, weights: dict[int, float],
                          rng: random.Random, per_question: bool = False, max_age: int | None = None,
                          half_life: float | None = None) -> list[str]:
    """ExGRPO question sampling with the age rules: n questions without replacement from `buckets` {k: [(uid,
    age of its newest candidate)]}.

    Questions whose newest candidate is older than `max_age` are left out (as if they had none). Without
    `half_life` the rest are drawn exactly as `selection.sample_questions` draws them. With it, question q
    of bucket k has the draw weight of ExGRPO's rule times d_q = age_factor(age_q): a bucket is drawn with
    weight w(k) x mean(d) (w(k) x sum(d) when per_question), then q inside it in proportion to d_q; d = 1
    gives back today's draw (not its rng calls).
    """
    kept = {k: [(u, a) for u, a in qs if young_enough(a, max_age)] for k, qs in buckets.items()}
    if half_life is None:
        return selection.sample_questions({k: [u for u, _ in qs] for k, qs in kept.items()}, n, weights, rng,
                                          per_question)
    if n < 0:
        raise selection.SelectionError(f"n must be >= 0, got {n}")
    selection.sample_questions({k: [u for u, _ in qs] for k, qs in kept.items()}, 0, weights, rng)  # input checks
    pools = {k: [(u, age_factor(a, half_life)) for u, a in kept[k]] for k in sorted(kept)
             if kept[k] and weights.get(k, 0.0) > 0}
    out: list[str] = []
    while len(out) < n and pools:
        keys = list(pools)
        mass = [sum(d for _, d in pools[k]) for k in keys]
        bucket_w = [weights[key] * (m if per_question else m / len(pools[key])) for key, m in zip(keys, mass)]
        if not sum(bucket_w) > 0:
            break  # every candidate left is too old to weigh anything
        k = rng.choices(keys, weights=bucket_w)[0]
        pool = pools[k]
        i = rng.choices(range(len(pool)), weights=[d for _, d in pool])[0]
        out.append(pool.pop(i)[0])
        if not pool:
            del pools[k]
    return out
