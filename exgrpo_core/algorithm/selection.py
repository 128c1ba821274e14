"""Experience management rules of ExGRPO (paper §3.2): which questions and trajectories to replay.

Buckets by latest correctness k = K Acc(q); questions are drawn bucket-first with weight w(Acc),
then the lowest-entropy stored trajectory is replayed. The default Gaussian follows the authors' code
(sigma = 1 success count, i.e. 1/K in accuracy); the paper's literal sigma = 1 on accuracy is
`sigma_unit="accuracy"`. Pure functions on numbers and lists: the store owns the buckets.
"""

from __future__ import annotations

import math
import random
from typing import Callable, Sequence

import torch


class SelectionError(ValueError):
    """Invalid selection input (unknown variant, bad weights, inconsistent buckets)."""


def _gaussian(acc: float, s: float, mu: float = 0.5) -> float:
    return math.exp(-((acc - mu) ** 2) / (2.0 * s * s))


def _uniform(acc: float, s: float, mu: float = 0.5) -> float:
    return 1.0


def _linear(acc: float, s: float, mu: float = 0.5) -> float:
    return acc


def _sqrt(acc: float, s: float, mu: float = 0.5) -> float:
    return math.sqrt(acc)


# w(Acc, s, mu) -> unnormalised bucket weight; s is the Gaussian width and mu its centre, both in
# accuracy units (only the Gaussian reads them).
# bucket_uniform: every non-empty bucket equally likely; question_uniform: every pooled question equally
# likely (the paper's "w/o question selection"), i.e. weight 1 per question (`PER_QUESTION`).
BUCKET_WEIGHTINGS: dict[str, Callable[[float, float, float], float]] = {
    "gaussian": _gaussian, "bucket_uniform": _uniform, "question_uniform": _uniform, "linear": _linear,
    "sqrt": _sqrt}
PER_QUESTION = frozenset({"question_uniform"})
"""Weightings whose weight is per question: a bucket is drawn in proportion to weight x its size."""
_SIGMA_SCALE: dict[str, Callable[[float, int], float]] = {
    "count": lambda sigma, k: sigma / k, "accuracy": lambda sigma, k: sigma}


def bucket_weights(group_size: int, weighting: str, sigma: float, sigma_unit: str,
                   mu: float = 0.5, top: bool = False) -> dict[int, float]:
    """ExGRPO question weighting w(Acc(q)), Acc = k/K, for buckets k = 1..K-1 (unnormalised); also k = K
    with `top` (continuous rewards: bucket K holds the most spread groups, not the solved ones).

    gaussian: exp(-(Acc - mu)^2 / (2 s^2)), mu the centre in accuracy units (0.5: paper/code; Table 3
    also runs 0.25; in count units the centre is mu*K successes), s = sigma/K (unit "count", code) or
    sigma ("accuracy", paper text); bucket_uniform and question_uniform: 1 (per bucket / per question, see
    `PER_QUESTION`); linear: Acc; sqrt: sqrt(Acc).

    Example: K = 8, gaussian, sigma = 1, count -> weights exp(-(k - 4)^2 / 2), i.e. normalised
    .004/.054/.242/.399/.242/.054/.004 for k = 1..7; mu = 0.25 -> exp(-(k - 2)^2 / 2), peak at k = 2.
    """
    if group_size < 2:
        raise SelectionError(f"group_size must be >= 2, got {group_size}")
    if weighting not in BUCKET_WEIGHTINGS:
        raise SelectionError(f"unknown question weighting {weighting!r}; choose from {sorted(BUCKET_WEIGHTINGS)}")
    if sigma_unit not in _SIGMA_SCALE:
        raise SelectionError(f"unknown sigma_unit {sigma_unit!r}; choose from {sorted(_SIGMA_SCALE)}")
    if not sigma > 0:
        raise SelectionError(f"sigma must be > 0, got {sigma}")
    if not (isinstance(mu, (int, float)) and 0 <= mu <= 1):
        raise SelectionError(f"mu must be an accuracy in [0, 1], got {mu!r}")
    s = _SIGMA_SCALE[sigma_unit](sigma, group_size)
    w = BUCKET_WEIGHTINGS[weighting]
    return {k: w(k / group_size, s, float(mu)) for k in range(1, group_size + bool(top))}


def _check_weights(weights: dict[int, float]) -> None:
    for k, w in weights.items():
        if not (math.isfinite(w) and w >= 0):
            raise SelectionError(f"bucket weight for k={k} must be finite and >= 0, got {w}")


def _check_buckets(buckets: dict[int, list[str]], weights: dict[int, float]) -> None:
    _check_weights(weights)
    seen: set[str] = set()
    for k, qs in buckets.items():
        dup = seen.intersection(qs) or (len(set(qs)) != len(qs))
        if dup:
            raise SelectionError(f"question ids must be unique across buckets (bucket k={k} repeats some)")
        seen.update(qs)


def sample_questions(buckets: dict[int, list[str]], n: int, weights: dict[int, float],
                     rng: random.Random, per_question: bool = False) -> list[str]:
    """ExGRPO question sampling: bucket with probability proportional to w(Acc), then uniform inside.

    per_question: draw a bucket in proportion to w(Acc) x its remaining size instead, i.e. each
    question with its own weight (uniform weights: the paper's "w/o question selection").

    Draws n questions without replacement. Each draw picks among the non-empty buckets with a
    positive weight, so when a bucket runs out its share goes to the others by their weights.
    Buckets absent from `weights` or weighted 0 (e.g. k = 0 or k = K under the defaults) are never
    drawn. Returns fewer than n only when the drawable pool is exhausted. Deterministic given `rng`;
    the input lists are not modified.

    Args:
        buckets: {k: [question uids]} (a uid appears in at most one bucket).
        n: number of questions wanted (>= 0).
        weights: {k: w}, e.g. from `bucket_weights`.
        rng: source of randomness (seeded by the caller).
    """
    if n < 0:
        raise SelectionError(f"n must be >= 0, got {n}")
    _check_buckets(buckets, weights)
    pools = {k: list(buckets[k]) for k in sorted(buckets) if buckets[k] and weights.get(k, 0.0) > 0}
    out: list[str] = []
    while len(out) < n and pools:
        keys = list(pools)
        k = rng.choices(keys, weights=[weights[key] * (len(pools[key]) if per_question else 1) for key in keys])[0]
        pool = pools[k]
        i = rng.randrange(len(pool))
        pool[i], pool[-1] = pool[-1], pool[i]  # O(1) removal; order inside a bucket is irrelevant
        out.append(pool.pop())
        if not pool:
            del pools[k]
    return out


def sample_bucket_positions(counts: dict[int, int], n: int, weights: dict[int, float],
                            rng: random.Random, per_question: bool = False) -> list[tuple[int, int]]:
    """ExGRPO question sampling (bucket by w(Acc), uniform inside) on bucket sizes only.

    The draw of `sample_questions` on buckets of these sizes, with the same rng calls in the same
    order: draw j there returns `buckets[k][index]` for the j-th (k, index) returned here, `index`
    being the position in the bucket's list as given. The buckets are virtual arrays: a length and
    the positions moved by the swap-with-last removal, so the cost is O(n), not O(pool).

    Args:
        counts: {k: number of questions in bucket k} (>= 0).
        n, weights, rng, per_question: as for `sample_questions`.
    """
    if n < 0:
        raise SelectionError(f"n must be >= 0, got {n}")
    _check_weights(weights)
    for k, c in counts.items():
        if isinstance(c, bool) or not isinstance(c, int) or c < 0:
            raise SelectionError(f"bucket size for k={k} must be an integer >= 0, got {c!r}")
    sizes = {k: counts[k] for k in sorted(counts) if counts[k] and weights.get(k, 0.0) > 0}
    moved: dict[int, dict[int, int]] = {k: {} for k in sizes}  # per bucket: position -> original index
    out: list[tuple[int, int]] = []
    while len(out) < n and sizes:
        keys = list(sizes)
        k = rng.choices(keys, weights=[weights[key] * (sizes[key] if per_question else 1) for key in keys])[0]
        last = sizes[k] - 1
        i = rng.randrange(last + 1)
        here = moved[k]
        out.append((k, here.get(i, i)))
        tail = here.pop(last, last)  # the last element moves into the hole at i
        if i != last:
            here[i] = tail
        sizes[k] = last
        if not last:
            del sizes[k]
    return out


def _argmin(entropies: Sequence[float], rng: random.Random) -> int:
    return min(range(len(entropies)), key=lambda i: entropies[i])


def _argmax(entropies: Sequence[float], rng: random.Random) -> int:
    return max(range(len(entropies)), key=lambda i: entropies[i])


def _random(entropies: Sequence[float], rng: random.Random) -> int:
    return rng.randrange(len(entropies))


# Trajectory choosers: argmin (default, paper), argmax and random (ablations). Ties -> first index.
TRAJECTORY_CHOOSERS: dict[str, Callable[[Sequence[float], random.Random], int]] = {
    "argmin": _argmin, "argmax": _argmax, "random": _random}


def choose_trajectory(entropies: list[float], mode: str, rng: random.Random) -> int:
    """ExGRPO trajectory selection: index of the stored correct trajectory with the lowest H(o).

    Args:
        entropies: H(o) of each candidate under the current policy (non-empty, no NaN).
        mode: "argmin" (default), "argmax" or "random".
        rng: used by "random" only.
    """
    if mode not in TRAJECTORY_CHOOSERS:
        raise SelectionError(f"unknown trajectory mode {mode!r}; choose from {sorted(TRAJECTORY_CHOOSERS)}")
    if len(entropies) == 0:
        raise SelectionError("no candidate trajectories to choose from")
    if any(math.isnan(h) for h in entropies):
        raise SelectionError(f"trajectory entropies contain NaN: {list(entropies)}")
    return TRAJECTORY_CHOOSERS[mode](entropies, rng)


def is_retired(k: int, group_size: int) -> bool:
    """ExGRPO retired set: a question whose latest group is all correct (k == K)."""
    if not 0 <= k <= group_size:
        raise SelectionError(f"k must be in 0..{group_size}, got {k}")
    return k == group_size


def is_collectable(k: int, min_k: int, max_k: int) -> bool:
    """Collection rule (code default 1 <= k <= K-1): store the correct responses of this group?"""
    if min_k > max_k:
        raise SelectionError(f"collect_min_k must be <= collect_max_k (got {min_k} > {max_k})")
    return min_k <= k <= max_k


def batch_correct_fraction(rewards: torch.Tensor | Sequence[float]) -> float:
    """Fraction of the batch's rollouts that are correct (reward > 0), for the delayed start."""
    r = torch.as_tensor(rewards, dtype=torch.float64).flatten()
    if r.numel() == 0:
        raise SelectionError("batch_correct_fraction needs at least one reward")
    return float((r > 0).double().mean())


def batch_mean_reward(rewards: torch.Tensor | Sequence[float]) -> float:
    """Mean reward of the batch's rollouts: the delayed start's measure with continuous rewards (for 0/1
    rewards it equals `batch_correct_fraction`)."""
    r = torch.as_tensor(rewards, dtype=torch.float64).flatten()
    if r.numel() == 0:
        raise SelectionError("batch_mean_reward needs at least one reward")
    return float(r.mean())


def replay_should_start(frac: float, threshold: float) -> bool:
    """Delayed start (code `experience_start_sratio`): replay turns on once frac > threshold.

    threshold 0 starts at once (the paper's setting for Llama-3.1-8B base), whatever frac is.
    """
    if not 0 <= threshold <= 1:
        raise SelectionError(f"start threshold must be in [0, 1], got {threshold}")
    return threshold == 0 or frac > threshold


def target_gap(drawn: list[int | None], weights: dict[int, float]) -> float:
    """Total variation between the step's replays by source bucket and the normalised target weights:
    0 when they match (or nothing was replayed), 1 when every replay came from a bucket the target never
    draws. Per-question weightings (question_uniform) have no bucket target: 0."""
    ks = [k for k in drawn if k is not None]
    total = sum(weights.values())
    if not ks or total <= 0:
        return 0.0
    share = {k: ks.count(k) / len(ks) for k in set(ks)}
    return 0.5 * sum(abs(share.get(k, 0.0) - weights.get(k, 0.0) / total) for k in set(share) | set(weights))
