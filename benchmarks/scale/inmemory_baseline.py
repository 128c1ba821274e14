"""In-memory experience buffer organised the way the authors' ExGRPO code (a verl fork) does it.

Their trainer keeps `experience_pool: {uid: [experience, ...]}` (text + old log-prob tensor) in the
training process, buckets as `{num_success: [uid, ...]}` Python lists with a `uid -> bucket` map
(a move is `list.remove` from the old bucket and `append` to the new one), a `skip_uid_set` of
retired questions, and before each replay draw filters every bucket down to the uids that still have
experience. Written here from that description (our own code, not theirs), with one kindness: the
membership tests use sets. It has no database, so a crash loses it and there is no rollback.
`db_scale.py` times it on the same synthetic runs and the same batches as the database.
"""

from __future__ import annotations

import random

import numpy as np

from exgrpo_core.algorithm import selection
from exgrpo_core.types import GroupResult


class InMemoryBuffer:
    """Per-bucket Python lists plus a per-question experience list, all in the training process."""

    def __init__(self, group_size: int, collect_min_k: int = 1, collect_max_k: int | None = None):
        self.K = group_size
        self.lo, self.hi = collect_min_k, group_size - 1 if collect_max_k is None else collect_max_k
        self.pool: dict[str, list[dict]] = {}
        self.texts: dict[str, set[str]] = {}  # de-duplication by exact text
        self.buckets: dict[int, list[str]] = {}
        self.bucket_of: dict[str, int] = {}
        self.retired: set[str] = set()

    def _move(self, uid: str, k: int) -> None:
        old = self.bucket_of.get(uid)
        if old == k:
            return
        if old is not None:
            self.buckets[old].remove(uid)  # O(bucket size), as a Python list
        self.buckets.setdefault(k, []).append(uid)
        self.bucket_of[uid] = k

    def update(self, step: int, groups: list[GroupResult]) -> int:
        """One step's buffer update (docs/implementation_details.md): buckets, collection with de-dup, retirement. Returns collected."""
        collected = 0
        for g in groups:
            k = g.k
            self._move(g.question_uid, k)
            if k == self.K:  # retire: experiences leave the pool, question skipped from now on
                self.retired.add(g.question_uid)
                self.pool.pop(g.question_uid, None)
                continue
            if not (self.lo <= k <= self.hi) or g.question_uid in self.retired:
                continue
            seen = self.texts.setdefault(g.question_uid, set())
            for r in g.rollouts:
                if r.reward > 0 and r.replayed_from is None and r.text not in seen:
                    seen.add(r.text)
                    self.pool.setdefault(g.question_uid, []).append(dict(
                        text=r.text, ids=np.asarray(r.response_ids, np.int32),
                        old_log_prob=np.asarray(r.behaviour_logprobs, np.float32), step=r.step))
                    collected += 1
        return collected

    def sample(self, n: int, weights: dict[int, float], rng: random.Random) -> list[str]:
        """Filter every bucket to questions with experience, then the weighted bucket draw."""
        valid = {k: [u for u in uids if u in self.pool] for k, uids in self.buckets.items()}
        return selection.sample_questions({k: v for k, v in valid.items() if v}, n, weights, rng)

    def candidates(self, uids: list[str]) -> dict[str, list[dict]]:
        return {u: list(self.pool.get(u, [])) for u in uids}


def load_from_simulation(sim, K: int, seed: int) -> InMemoryBuffer:
    """The pooled experience of a `synth_store.simulate` run, with payloads of the same lengths."""
    rng = np.random.default_rng(seed + 1)
    buf = InMemoryBuffer(K)
    c = sim.t_cols
    for q, pooled in enumerate(sim.pool):
        uid = f"synth-{q}"
        if sim.q_latest[q] >= 0:
            buf._move(uid, int(sim.q_latest[q]))
        if sim.q_retired_step[q] >= 0:
            buf.retired.add(uid)
        for t in pooled:
            n = c["length"][t]
            text = f"Attempt {t}"
            buf.pool.setdefault(uid, []).append(dict(
                text=text, ids=rng.integers(0, 49_152, n, dtype=np.int32),
                old_log_prob=(-rng.exponential(0.4, n)).astype(np.float32), step=c["step"][t]))
            buf.texts.setdefault(uid, set()).add(text)
    return buf
