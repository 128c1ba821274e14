"""Verifier audit in SQL (docs/verifier_audit.md): read a run's stored trajectories for regrading,
and apply reward changes with a record of each.

`apply_reward_changes` is one transaction: every changed trajectory gets its new reward and audit
fields and a `reward_changes` row (trajectory id, old, new, verifier and version, time). A pooled
trajectory that is now wrong leaves the pool (it would be replayed as correct); its question's pool
size is recounted, the pool slots are renumbered and `runs.slots_logged_after` moves to the run's
step (a rollback before it renumbers: the history changed outside the slot log).
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import Connection, bindparam, func, insert, select, update

from exgrpo_core.store.buffer import bulk_insert, chunks
from exgrpo_core.store.engine import StoreError, read_connection, write_transaction
from exgrpo_core.store.replay import renumber_slots
from exgrpo_core.store.tables import QuestionRow, QuestionState, RewardChange, Run, Trajectory

AUDIT_FIELDS = ("prediction", "gold", "verifier", "verifier_version", "verify_timed_out", "verify_reason")


def stored_rows(conn: Connection, run_id: str) -> list[dict]:
    """Every trajectory of the run with its question's uid, source and gold, by id."""
    T, QS, Q = Trajectory, QuestionState, QuestionRow
    q = (select(T.id, QS.uid, Q.source, Q.answer, T.text, T.truncated, T.reward, T.in_pool, T.step,
                *[getattr(T, c) for c in AUDIT_FIELDS])
         .join(QS, (QS.run_id == T.run_id) & (QS.question_id == T.question_id)).join(Q, Q.id == T.question_id)
         .where(T.run_id == run_id).order_by(T.id))
    keys = ("id", "uid", "source", "answer", "text", "truncated", "reward", "in_pool", "step") + AUDIT_FIELDS
    return [dict(zip(keys, row)) for row in conn.execute(q)]


def apply_reward_changes(conn: Connection, run_id: str, changes: list[dict]) -> dict[str, int]:
    """Apply `changes` ({id, old, new} + AUDIT_FIELDS) in the caller's transaction; see module doc.
    A trajectory whose stored reward is no longer `old` (changed since it was read) is an error."""
    T, QS = Trajectory, QuestionState
    run_step = conn.execute(select(Run.step).where(Run.id == run_id)).scalar_one_or_none()
    if run_step is None:
        raise StoreError(f"unknown run id {run_id!r}")
    ids = [c["id"] for c in changes]
    now: dict[int, tuple] = {}
    for part in chunks(ids):
        now.update((tid, (reward, pooled, qid)) for tid, reward, pooled, qid in conn.execute(
            select(T.id, T.reward, T.in_pool, T.question_id).where(T.run_id == run_id, T.id.in_(part))))
    stale = [c["id"] for c in changes if c["id"] not in now or now[c["id"]][0] != c["old"]]
    if stale:
        raise StoreError(f"trajectories of run {run_id} changed since they were graded: {stale[:5]}; run again")
    leaving = {c["id"] for c in changes if now[c["id"]][1] and c["new"] <= 0}
    stmt = update(T).where(T.id == bindparam("b_id")).values(
        reward=bindparam("b_new"), in_pool=bindparam("b_pool"), **{f: bindparam(f"b_{f}") for f in AUDIT_FIELDS})
    for part in chunks(changes):
        conn.execute(stmt, [dict(b_id=c["id"], b_new=c["new"], b_pool=bool(now[c["id"]][1]) and c["id"] not in leaving,
                                 **{f"b_{f}": c[f] for f in AUDIT_FIELDS}) for c in part])
    at = datetime.now(timezone.utc)
    bulk_insert(conn, insert(RewardChange), [dict(
        run_id=run_id, trajectory_id=c["id"], old_reward=c["old"], new_reward=c["new"], verifier=c["verifier"],
        verifier_version=c["verifier_version"], changed_at=at) for c in changes])
    if leaving:
        qids = sorted({now[t][2] for t in leaving})
        pool = select(func.count()).select_from(T).where(
            T.run_id == QS.run_id, T.question_id == QS.question_id, T.in_pool.is_(True)).scalar_subquery()
        for part in chunks(qids):
            conn.execute(update(QS).where(QS.run_id == run_id, QS.question_id.in_(part)).values(pool_size=pool))
        renumber_slots(conn, run_id)
        conn.execute(update(Run).where(Run.id == run_id, Run.slots_logged_after < run_step)
                     .values(slots_logged_after=run_step))
    return {"changed": len(changes), "left_pool": len(leaving)}


class AuditStore:
    """The verifier-audit methods of `ExperienceStore` (mixed in)."""

    engine = None  # set by ExperienceStore

    def stored_trajectories(self, run_id: str) -> list[dict]:
        """Every trajectory of the run with what regrading needs (`audit.stored_rows`)."""
        with read_connection(self.engine, f"reading the trajectories of run {run_id}") as conn:
            return stored_rows(conn, run_id)

    def apply_reward_changes(self, run_id: str, changes: list[dict]) -> dict[str, int]:
        """Change stored rewards, recording each change, all or nothing (`audit.apply_reward_changes`)."""
        with write_transaction(self.engine, f"changing rewards of run {run_id}") as conn:
            return apply_reward_changes(conn, run_id, changes)

    def reward_changes(self, run_id: str) -> list[dict]:
        """The run's recorded reward changes, oldest first."""
        R = RewardChange
        with read_connection(self.engine, f"reading reward changes of run {run_id}") as conn:
            rows = conn.execute(select(R.trajectory_id, R.old_reward, R.new_reward, R.verifier, R.verifier_version,
                                       R.changed_at).where(R.run_id == run_id).order_by(R.id)).mappings().all()
        return [dict(r) for r in rows]
