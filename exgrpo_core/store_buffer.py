"""Experience management in SQL (SPEC §1.2): collection, de-duplication, buckets and retirement.

Functions here take an open connection inside the caller's transaction; `ExperienceStore` owns the
transactions. Deviation from the literal rule text: a correct response of an already-retired question
is stored as experience flagged `retired` (never pooled), so retirement stays permanent.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

from sqlalchemy import Connection, bindparam, exists, func, insert, or_, select, update

from exgrpo_core import metrics as M
from exgrpo_core.codec import CodecError, encode_logprobs, encode_token_ids
from exgrpo_core.store_engine import StoreError
from exgrpo_core.store_models import GroupResultRow, QuestionState, Trajectory
from exgrpo_core.types import BufferState, GroupResult, Rollout

CHUNK = 1000  # rows or IN-list items per statement (SQLite caps bound parameters)


@dataclass(frozen=True)
class CollectRule:
    """Which groups feed the pool: collect_min_k <= k <= collect_max_k, retire at k == group_size."""

    group_size: int
    collect: bool
    collect_min_k: int
    collect_max_k: int
    retire: bool
    store_all: bool

    def collects(self, k: int) -> bool:
        return self.collect and self.collect_min_k <= k <= self.collect_max_k

    def retires(self, k: int) -> bool:
        return self.retire and k == self.group_size


def chunks(items: list, size: int = CHUNK):
    for i in range(0, len(items), size):
        yield items[i:i + size]


def none_if_nan(x: float | None) -> float | None:
    return None if x is None or math.isnan(x) else float(x)


def states_by_uid(conn: Connection, run_id: str, uids: set[str]) -> dict[str, tuple[int, bool]]:
    """uid -> (question_id, retired) for the registered questions of `run_id` among `uids`."""
    found: dict[str, tuple[int, bool]] = {}
    for part in chunks(sorted(uids)):
        q = select(QuestionState.uid, QuestionState.question_id, QuestionState.retired).where(
            QuestionState.run_id == run_id, QuestionState.uid.in_(part))
        found.update({uid: (qid, bool(ret)) for uid, qid, ret in conn.execute(q)})
    missing = sorted(uids - found.keys())
    if missing:
        raise StoreError(f"question uids never registered for run {run_id}: {missing[:5]}"
                         f"{' ...' if len(missing) > 5 else ''} (call register_questions first)")
    return found


def apply_groups(conn: Connection, run_id: str, step: int, groups: list[GroupResult],
                 rule: CollectRule) -> dict[str, float]:
    """ExGRPO §3.2 experience collection for one step's verified groups, in the caller's transaction.

    Returns:
        buffer/collected, buffer/duplicates, buffer/newly_retired, buffer/stored_rollouts.
    """
    if not groups:
        return {M.COLLECTED: 0.0, M.DUPLICATES: 0.0, M.NEWLY_RETIRED: 0.0, M.STORED_ROLLOUTS: 0.0}
    states = states_by_uid(conn, run_id, {g.question_uid for g in groups})
    newly_retired = {states[g.question_uid][0] for g in groups
                     if rule.retires(g.k) and not states[g.question_uid][1]}
    retired_after = {qid for qid, ret in states.values() if ret} | newly_retired
    conn.execute(insert(GroupResultRow), [
        dict(run_id=run_id, question_id=states[g.question_uid][0], step=step, k=g.k, n=g.size,
             is_replay=g.is_replay) for g in groups])
    _update_states(conn, run_id, step, groups, states)
    if newly_retired:
        _retire(conn, run_id, step, sorted(newly_retired))
    rows, collected, duplicates = _trajectory_rows(conn, run_id, step, groups, states, retired_after, rule)
    for part in chunks(rows, 256):  # blobs: keep statements moderate
        conn.execute(insert(Trajectory), part)
    return {M.COLLECTED: float(collected), M.DUPLICATES: float(duplicates),
            M.NEWLY_RETIRED: float(len(newly_retired)), M.STORED_ROLLOUTS: float(len(rows))}


def _update_states(conn: Connection, run_id: str, step: int, groups: list[GroupResult],
                   states: dict[str, tuple[int, bool]]) -> None:
    latest: dict[int, tuple[int, int]] = {}  # question_id -> (k of its last group, groups in this call)
    for g in groups:
        qid = states[g.question_uid][0]
        latest[qid] = (g.k, latest.get(qid, (0, 0))[1] + 1)
    stmt = update(QuestionState).where(
        QuestionState.run_id == bindparam("b_run"), QuestionState.question_id == bindparam("b_qid")).values(
        latest_k=bindparam("b_k"), n_groups=QuestionState.n_groups + bindparam("b_n"), last_step=bindparam("b_step"))
    conn.execute(stmt, [dict(b_run=run_id, b_qid=qid, b_k=k, b_n=n, b_step=step) for qid, (k, n) in latest.items()])


def _retire(conn: Connection, run_id: str, step: int, qids: list[int]) -> None:
    """Retired set (SPEC §1.2): the question leaves the pool; its experiences stay, flagged."""
    for part in chunks(qids):
        conn.execute(update(QuestionState).where(
            QuestionState.run_id == run_id, QuestionState.question_id.in_(part), QuestionState.retired.is_(False),
        ).values(retired=True, retired_step=step))
        conn.execute(update(Trajectory).where(
            Trajectory.run_id == run_id, Trajectory.question_id.in_(part), Trajectory.in_pool.is_(True),
        ).values(in_pool=False, retired=True))


def _sha1(s: str) -> str:
    return hashlib.sha1(s.encode("utf-8")).hexdigest()


def _existing_texts(conn: Connection, run_id: str, cands: list[tuple[int, Rollout]]) -> set[tuple[int, str]]:
    """(question_id, text) of stored experience (pooled or retired) matching the candidates' texts."""
    if not cands:
        return set()
    qids = sorted({qid for qid, _ in cands})
    hashes = sorted({_sha1(r.text) for _, r in cands})
    out: set[tuple[int, str]] = set()
    for qpart in chunks(qids, 500):
        for hpart in chunks(hashes, 500):
            q = select(Trajectory.question_id, Trajectory.text).where(
                Trajectory.run_id == run_id, Trajectory.question_id.in_(qpart), Trajectory.text_sha1.in_(hpart),
                or_(Trajectory.in_pool.is_(True), Trajectory.retired.is_(True)))
            out.update((qid, text) for qid, text in conn.execute(q))
    return out


def _trajectory_rows(conn: Connection, run_id: str, step: int, groups: list[GroupResult],
                     states: dict[str, tuple[int, bool]], retired_after: set[int],
                     rule: CollectRule) -> tuple[list[dict], int, int]:
    """Rows to insert: de-duplicated correct responses of eligible groups, plus (store_all) the rest."""
    fresh = [(states[g.question_uid][0], g.k, r) for g in groups for r in g.rollouts if r.replayed_from is None]
    cands = [(qid, r) for qid, k, r in fresh if rule.collects(k) and r.reward > 0]
    seen = _existing_texts(conn, run_id, cands)
    rows, collected, duplicates = [], 0, 0
    for qid, k, r in fresh:
        experience = rule.collects(k) and r.reward > 0
        if experience and (qid, r.text) in seen:
            duplicates, experience = duplicates + 1, False
        if not (experience or rule.store_all):
            continue
        if experience:
            seen.add((qid, r.text))
            collected += 1
            if len(r.behaviour_logprobs) != len(r.response_ids):
                raise StoreError(f"rollout of question {r.question_uid!r} has {len(r.response_ids)} tokens but "
                                 f"{len(r.behaviour_logprobs)} behaviour log-probs; they must match to be replayed")
        retired = experience and qid in retired_after
        try:
            ids, lps = encode_token_ids(r.response_ids), encode_logprobs(r.behaviour_logprobs)
        except CodecError as e:
            raise StoreError(f"rollout of question {r.question_uid!r} cannot be stored: {e}") from e
        rows.append(dict(
            run_id=run_id, question_id=qid, step=r.step, collected_step=step, reward=float(r.reward),
            entropy=none_if_nan(r.entropy), length=len(r.response_ids), truncated=bool(r.truncated), text=r.text,
            text_sha1=_sha1(r.text), token_ids=ids, behaviour_logprobs=lps, in_pool=experience and not retired,
            retired=retired, times_replayed=0, last_replayed_step=None))
    return rows, collected, duplicates


def read_buffer_state(conn: Connection, run_id: str, group_size: int) -> BufferState:
    """Buckets by latest k (SPEC §1.2) and pool sizes, aggregated by the database."""
    qs = QuestionState
    counts = dict(conn.execute(select(qs.latest_k, func.count()).where(
        qs.run_id == run_id, qs.latest_k.is_not(None)).group_by(qs.latest_k)).all())
    bucket_counts = {k: int(counts.pop(k, 0)) for k in range(group_size + 1)}
    bucket_counts.update({int(k): int(n) for k, n in counts.items()})  # k outside 0..K: shown, not hidden
    pooled = exists().where(Trajectory.run_id == qs.run_id, Trajectory.question_id == qs.question_id,
                            Trajectory.in_pool.is_(True))
    buckets: dict[int, list[str]] = {}
    for k, uid in conn.execute(select(qs.latest_k, qs.uid).where(
            qs.run_id == run_id, qs.retired.is_(False), qs.latest_k.is_not(None), pooled).order_by(qs.latest_k, qs.uid)):
        buckets.setdefault(int(k), []).append(uid)
    retired = conn.execute(select(func.count()).select_from(qs).where(
        qs.run_id == run_id, qs.retired.is_(True))).scalar_one()
    pool_trajectories = conn.execute(select(func.count()).select_from(Trajectory).where(
        Trajectory.run_id == run_id, Trajectory.in_pool.is_(True))).scalar_one()
    return BufferState(buckets=buckets, bucket_counts=bucket_counts,
                       pool_questions=sum(len(v) for v in buckets.values()),
                       pool_trajectories=int(pool_trajectories), retired_questions=int(retired))
