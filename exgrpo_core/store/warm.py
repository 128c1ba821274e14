"""Experience reuse across runs in SQL (docs/experience_reuse.md): read an earlier run's pool, seed a
new run's pool with copies of it.

`pool_export` only reads the source run. `seed_pool` writes the copies into the new run in the
caller's transaction: each trajectory keeps its token ids, behaviour log-probs (those of the policy
that sampled it), entropy, text and audit fields, is stamped `collected_step = -1` (before the first
step, so no rollback removes it) and `step = source step - source last step - 1` (its age in policy
updates counts on from the source run's end), and records its origin. Each seeded question enters
the bucket it had in the source (`warm_k` too, which rollback falls back to), with pool slots logged
at step -1.
"""

from __future__ import annotations

import json

from sqlalchemy import Connection, and_, bindparam, select, update

from exgrpo_core.store.buffer import chunks, insert_trajectories
from exgrpo_core.store.engine import StoreError, read_connection, write_transaction
from exgrpo_core.store.replay import move_slots
from exgrpo_core.store.tables import QuestionRow, QuestionState, Run, Trajectory

COPIED = ("step", "reward", "entropy", "length", "truncated", "text", "text_sha1", "token_ids", "behaviour_logprobs",
          "prediction", "gold", "verifier", "verifier_version", "verify_timed_out", "verify_reason")


def question_digests(conn: Connection, run_id: str) -> set[str]:
    """Digests of every question registered in the run."""
    return set(conn.execute(select(QuestionRow.digest).join(QuestionState, QuestionState.question_id == QuestionRow.id)
                            .where(QuestionState.run_id == run_id)).scalars())


def pool_export(conn: Connection, run_id: str, versions: set[str] | None, max_age: int | None) -> dict:
    """The run's pool: {"buckets": {digest: latest k}, "trajectories": [row dicts]}.

    Pooled correct trajectories of pooled questions (not retired), oldest first, keeping those whose
    verifier_version is in `versions` (None: any, unrecorded included) and that were sampled at most
    `max_age` steps before the run's last step (None: any).
    """
    T, QS, Q = Trajectory, QuestionState, QuestionRow
    last = conn.execute(select(Run.step).where(Run.id == run_id)).scalar_one()
    where = [T.run_id == run_id, T.in_pool.is_(True), T.reward > 0, QS.retired.is_(False)]
    if versions is not None:
        where.append(T.verifier_version.in_(sorted(versions)))
    if max_age is not None:
        where.append(T.step >= last - max_age)
    cols = [getattr(T, c) for c in COPIED]
    rows = conn.execute(select(Q.digest, QS.latest_k, T.id, *cols)
                        .join(QS, and_(QS.run_id == T.run_id, QS.question_id == T.question_id))
                        .join(Q, Q.id == T.question_id).where(*where).order_by(T.id)).all()
    buckets: dict[str, int] = {}
    out = []
    for digest, k, tid, *values in rows:
        buckets[digest] = k
        out.append(dict(zip(COPIED, values), digest=digest, origin_trajectory_id=tid, origin_run_id=run_id,
                        step=values[0] - last - 1))
    return {"buckets": buckets, "trajectories": out}


def seed_pool(conn: Connection, run_id: str, exports: list[dict], record: dict) -> dict | None:
    """Copy the exported pools (in priority order: a question's bucket comes from the first export
    holding it) into the run, in the caller's transaction; returns the counts, or None when the run
    was seeded before (resume: never twice). Questions not registered in the run are skipped, texts
    already seeded for a question are not copied again."""
    seeded = conn.execute(select(Run.warm_start_json).where(Run.id == run_id)).first()
    if seeded is None:
        raise StoreError(f"unknown run id {run_id!r} (call start_run first)")
    if seeded[0] is not None:
        return None
    QS, Q = QuestionState, QuestionRow
    states = {d: (qid, uid) for d, qid, uid in conn.execute(
        select(Q.digest, QS.question_id, QS.uid).join(Q, Q.id == QS.question_id).where(QS.run_id == run_id))}
    bucket: dict[str, int] = {}
    rows, seen = [], set()
    for export in exports:
        for d, k in export["buckets"].items():
            bucket.setdefault(d, k)
        for t in export["trajectories"]:
            key = (t["digest"], t["text"])
            if t["digest"] not in states or key in seen:
                continue
            seen.add(key)
            rows.append({**{c: t[c] for c in COPIED}, "run_id": run_id, "question_id": states[t["digest"]][0],
                         "collected_step": -1, "in_pool": True, "retired": False, "times_replayed": 0,
                         "last_replayed_step": None, "origin_run_id": t["origin_run_id"],
                         "origin_trajectory_id": t["origin_trajectory_id"]})
    per_q: dict[int, int] = {}
    for r in rows:
        per_q[r["question_id"]] = per_q.get(r["question_id"], 0) + 1
    joining = sorted((bucket[d], uid, qid) for d, (qid, uid) in states.items() if qid in per_q)
    move_slots(conn, run_id, -1, [], joining)
    stmt = update(QS).where(QS.run_id == run_id, QS.question_id == bindparam("b_qid")).values(
        latest_k=bindparam("b_k"), warm_k=bindparam("b_k"), pool_size=bindparam("b_n"))
    params = [dict(b_qid=qid, b_k=k, b_n=per_q[qid]) for k, _, qid in joining]
    for part in chunks(params):
        conn.execute(stmt, part)
    insert_trajectories(conn, rows)
    counts = {"trajectories": len(rows), "questions": len(per_q)}
    conn.execute(update(Run).where(Run.id == run_id).values(warm_start_json=json.dumps({**record, **counts})))
    return counts


class WarmStartStore:
    """The warm-start methods of `ExperienceStore` (mixed in; each one transaction)."""

    engine = None  # set by ExperienceStore

    def question_digests(self, run_id: str) -> set[str]:
        """Digests of the questions registered in the run (`question_digest`)."""
        with read_connection(self.engine, f"reading the questions of run {run_id}") as conn:
            return question_digests(conn, run_id)

    def pool_export(self, run_id: str, versions: set[str] | None = None, max_age: int | None = None) -> dict:
        """The run's pooled correct trajectories and buckets, filtered (`warm.pool_export`); reads only."""
        with read_connection(self.engine, f"reading the pool of run {run_id}") as conn:
            if conn.execute(select(Run.id).where(Run.id == run_id)).first() is None:
                raise StoreError(f"unknown run id {run_id!r}")
            return pool_export(conn, run_id, versions, max_age)

    def seed_pool(self, run_id: str, exports: list[dict], record: dict) -> dict | None:
        """Seed the run's pool from exported pools, once, all or nothing (`warm.seed_pool`)."""
        with write_transaction(self.engine, f"warm-starting the pool of run {run_id}") as conn:
            return seed_pool(conn, run_id, exports, record)
