"""Experience management in SQL (docs/implementation_details.md): collection, de-duplication, buckets and retirement.

Functions here take an open connection inside the caller's transaction; `ExperienceStore` owns the
transactions. Deviation from the literal rule text: a correct response of an already-retired question
is stored as experience flagged `retired` (never pooled), so retirement stays permanent.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from dataclasses import dataclass

from sqlalchemy import Connection, and_, bindparam, case, func, insert, or_, select, update

from exgrpo_core import metrics as M
from exgrpo_core.store.codec import CodecError, encode_logprobs, encode_token_ids
from exgrpo_core.store.engine import StoreError
from exgrpo_core.store.tables import GroupResultRow, QuestionState, RetirementReview, Trajectory
from exgrpo_core.store.replay import move_slots, pooled_filter
from exgrpo_core.types import BufferState, GroupResult, Rollout

CHUNK = 1000  # IN-list items (SQLite caps bound parameters) and rows per executemany batch


@dataclass(frozen=True)
class CollectRule:
    """Which groups feed the pool: collect_min_k <= k <= collect_max_k, retire at k == group_size."""

    group_size: int
    collect: bool
    collect_min_k: int
    collect_max_k: int
    retire: bool
    store_all: bool
    keep_bucket_on_zero: bool = False
    """(code) a pooled question whose group has k = 0 keeps its bucket (the authors skip the update)."""

    def collects(self, k: int) -> bool:
        return self.collect and self.collect_min_k <= k <= self.collect_max_k

    def retires(self, g: GroupResult) -> bool:
        return self.retire and g.solved


def chunks(items: list, size: int = CHUNK):
    for i in range(0, len(items), size):
        yield items[i:i + size]


def bulk_insert(conn: Connection, stmt, rows: list[dict]) -> None:
    """executemany in batches: psycopg 3 pipelines them (one network round trip per batch), sqlite3
    loops in C. Measured faster here than one multi-row VALUES statement, which SQLAlchemy compiles anew."""
    for part in chunks(rows):
        conn.execute(stmt, part)


# COPY column types of the trajectories table (id comes from its sequence)
_TRAJECTORY_COPY = {"run_id": "varchar", "question_id": "int4", "step": "int4", "collected_step": "int4",
                    "reward": "float8", "entropy": "float8", "length": "int4", "truncated": "bool", "text": "text",
                    "text_sha1": "varchar", "token_ids": "bytea", "behaviour_logprobs": "bytea", "in_pool": "bool",
                    "retired": "bool", "times_replayed": "int4", "last_replayed_step": "int4", "prediction": "text",
                    "gold": "text", "verifier": "varchar", "verifier_version": "varchar", "verify_timed_out": "bool",
                    "verify_reason": "varchar", "origin_run_id": "varchar", "origin_trajectory_id": "int8"}


def insert_trajectories(conn: Connection, rows: list[dict]) -> None:
    """Trajectory rows in the caller's transaction: PostgreSQL COPY (binary), else executemany.

    A step writes ~1000 rows of a few KB each (token ids, log-probs, text); COPY skips the per-row
    parse/bind of INSERT, which dominated the buffer update at 1M trajectories (benchmarks/scale/db_scale.py).
    """
    if conn.dialect.name != "postgresql" or not rows:
        bulk_insert(conn, insert(Trajectory), rows)
        return
    cols = list(_TRAJECTORY_COPY)
    cur = conn.connection.driver_connection.cursor()
    try:
        with cur.copy(f"COPY trajectories ({', '.join(cols)}) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types([_TRAJECTORY_COPY[c] for c in cols])
            for r in rows:
                copy.write_row([r[c] for c in cols])
    except Exception as e:  # psycopg errors are not SQLAlchemy's: name the problem here
        raise StoreError(f"storing {len(rows)} trajectories failed: {str(e).strip().splitlines()[0]}") from e
    finally:
        cur.close()


def none_if_nan(x: float | None) -> float | None:
    return None if x is None or math.isnan(x) else float(x)


def states_by_uid(conn: Connection, run_id: str, uids: set[str]) -> dict[str, tuple]:
    """uid -> (question_id, retired, latest_k, pool_size, slot) for the registered questions of `run_id`
    among `uids`."""
    qs = QuestionState
    found: dict[str, tuple] = {}
    for part in chunks(sorted(uids)):
        q = select(qs.uid, qs.question_id, qs.retired, qs.latest_k, qs.pool_size, qs.slot).where(
            qs.run_id == run_id, qs.uid.in_(part))
        found.update({uid: (qid, bool(ret), k, pool, slot) for uid, qid, ret, k, pool, slot in conn.execute(q)})
    missing = sorted(uids - found.keys())
    if missing:
        raise StoreError(f"question uids never registered for run {run_id}: {missing[:5]}"
                         f"{' ...' if len(missing) > 5 else ''} (call register_questions first)")
    return found


def apply_groups(conn: Connection, run_id: str, step: int, groups: list[GroupResult],
                 rule: CollectRule) -> dict[str, float]:
    """ExGRPO §3.2 experience collection for one step's verified groups, in the caller's transaction.

    Returns:
        buffer/collected, buffer/duplicates, buffer/newly_retired, buffer/stored_rollouts,
        buffer/pooled_zero_success (pooled questions whose group scored 0/K).
    """
    if not groups:
        return {M.COLLECTED: 0.0, M.DUPLICATES: 0.0, M.NEWLY_RETIRED: 0.0, M.STORED_ROLLOUTS: 0.0,
                M.POOLED_ZERO_SUCCESS: 0.0}
    states = states_by_uid(conn, run_id, {g.question_uid for g in groups})
    k_after, zero_pooled = bucket_after(groups, states, rule.keep_bucket_on_zero)
    newly_retired = {states[g.question_uid][0] for g in groups
                     if rule.retires(g) and not states[g.question_uid][1]}
    retired_after = {st[0] for st in states.values() if st[1]} | newly_retired
    rows, collected, duplicates = _trajectory_rows(conn, run_id, step, groups, states, retired_after, rule)
    bulk_insert(conn, insert(GroupResultRow), [
        dict(run_id=run_id, question_id=states[g.question_uid][0], step=step, k=g.k, n=g.size,
             is_replay=g.is_replay) for g in groups])
    _move_pool_slots(conn, run_id, step, k_after, states, rows, newly_retired)
    _update_states(conn, run_id, step, groups, k_after, states, rows)
    if newly_retired:
        _retire(conn, run_id, step, sorted(newly_retired))
    insert_trajectories(conn, rows)
    return {M.COLLECTED: float(collected), M.DUPLICATES: float(duplicates),
            M.NEWLY_RETIRED: float(len(newly_retired)), M.STORED_ROLLOUTS: float(len(rows)),
            M.POOLED_ZERO_SUCCESS: float(len(zero_pooled))}


def bucket_after(groups: list[GroupResult], states: dict[str, tuple],
                 keep_bucket_on_zero: bool) -> tuple[dict[str, int | None], set[str]]:
    """ExGRPO bucket move (latest k) of each question after these groups, and the pooled questions that scored 0/K.

    A question moves to the k of its last group; with `keep_bucket_on_zero` (the authors' code, which
    skips the bucket update on 0 successes) a question pooled before the update keeps its bucket
    when a group of it scores 0, instead of sitting in bucket 0, where it is never drawn.
    """
    k_after: dict[str, int | None] = {}
    zero: set[str] = set()
    for g in groups:
        _, retired, k, pool, _ = states[g.question_uid]
        pooled = not retired and pool > 0
        if g.successes == 0 and pooled:
            zero.add(g.question_uid)
        keep = keep_bucket_on_zero and g.successes == 0 and pooled
        k_after[g.question_uid] = k_after.get(g.question_uid, k) if keep else g.k
    return k_after, zero


def _move_pool_slots(conn: Connection, run_id: str, step: int, latest: dict[str, int | None],
                     states: dict[str, tuple], rows: list[dict], newly_retired: set[int]) -> None:
    """Questions entering, leaving or changing pooled bucket keep the slots dense (store_replay.move_slots)."""
    added = Counter(r["question_id"] for r in rows if r["in_pool"])
    leaving, joining = [], []
    for uid, k_after in latest.items():
        qid, retired, k, pool, slot = states[uid]
        before = not retired and pool > 0
        after = not retired and qid not in newly_retired and pool + added[qid] > 0
        if before and slot is None:
            raise StoreError(f"pooled question {uid!r} of run {run_id} has no pool slot (schema not migrated?)")
        if before and not (after and k_after == k):
            leaving.append((k, slot, qid))
        if after and not (before and k_after == k):
            joining.append((k_after, uid, qid))
    move_slots(conn, run_id, step, leaving, joining)


def _update_states(conn: Connection, run_id: str, step: int, groups: list[GroupResult], k_after: dict,
                   states: dict[str, tuple[int, bool]], rows: list[dict]) -> None:
    """Bucket move (latest k, `bucket_after`), group count, last step and pool size of every question."""
    latest: dict[int, tuple[int, int]] = {}  # question_id -> (its bucket after the call, groups in this call)
    for g in groups:
        qid = states[g.question_uid][0]
        latest[qid] = (k_after[g.question_uid], latest.get(qid, (0, 0))[1] + 1)
    pooled = Counter(r["question_id"] for r in rows if r["in_pool"])
    qs = QuestionState
    stmt = update(qs).where(qs.run_id == bindparam("b_run"), qs.question_id == bindparam("b_qid")).values(
        latest_k=bindparam("b_k"), n_groups=qs.n_groups + bindparam("b_n"), last_step=bindparam("b_step"),
        pool_size=qs.pool_size + bindparam("b_pool"))
    conn.execute(stmt, [dict(b_run=run_id, b_qid=qid, b_k=k, b_n=n, b_step=step, b_pool=pooled[qid])
                        for qid, (k, n) in latest.items()])


def _retire(conn: Connection, run_id: str, step: int, qids: list[int]) -> None:
    """Retired set (docs/implementation_details.md): the question leaves the pool; its experiences stay, flagged."""
    for part in chunks(qids):
        conn.execute(update(QuestionState).where(
            QuestionState.run_id == run_id, QuestionState.question_id.in_(part), QuestionState.retired.is_(False),
        ).values(retired=True, retired_step=step, pool_size=0))
        conn.execute(update(Trajectory).where(
            Trajectory.run_id == run_id, Trajectory.question_id.in_(part), Trajectory.in_pool.is_(True),
        ).values(in_pool=False, retired=True))


def review_count(fraction: float, n_retired: int) -> int:
    """Retired-set review (paper Table 7): ceil(fraction x |retired|) questions are put back (0 of none)."""
    if not 0 < fraction <= 1:
        raise StoreError(f"review fraction must be in (0, 1], got {fraction}")
    return min(n_retired, math.ceil(fraction * n_retired - 1e-9))  # 0.1 x 30 is 3, not ceil(3.0000000000000004)


def review_retired(conn: Connection, run_id: str, step: int, fraction: float, rng) -> list[str]:
    """Retired-set review (paper Table 7), in the caller's transaction: put back ceil(fraction x |retired|).

    The questions are `rng.sample(retired uids in code-point order, n)` (no draw at all when none is
    retired), so the run's seeded generator picks the same ones again after a resume. Each goes back to
    on-policy sampling (retired = False) and its retired experiences back to the pool in its latest
    bucket (latest k, often K until a new group moves it, and bucket K is never drawn for replay); its
    old retired_step is logged in `retirement_reviews` under `step` so a rollback before `step` retires
    it again. Returns the uids put back.
    """
    qs, T = QuestionState, Trajectory
    retired = sorted(conn.execute(select(qs.uid, qs.question_id, qs.latest_k, qs.retired_step).where(
        qs.run_id == run_id, qs.retired.is_(True))).all(), key=lambda r: r[0])
    n = review_count(fraction, len(retired))
    if n == 0:
        return []
    chosen = rng.sample(retired, n)
    qids = sorted(qid for _, qid, _, _ in chosen)
    pooled: Counter = Counter()
    for part in chunks(qids):
        pooled.update(dict(conn.execute(select(T.question_id, func.count()).where(
            T.run_id == run_id, T.question_id.in_(part), T.retired.is_(True)).group_by(T.question_id)).all()))
    bulk_insert(conn, insert(RetirementReview), [dict(run_id=run_id, step=step, question_id=qid, retired_step=rs)
                                                 for _, qid, _, rs in sorted(chosen, key=lambda r: r[1])])
    # joining their buckets first: move_slots reads the buckets before the states change
    move_slots(conn, run_id, step, [], [(k, uid, qid) for uid, qid, k, _ in chosen
                                        if pooled[qid] > 0 and k is not None])
    for part in chunks(qids):
        conn.execute(update(T).where(T.run_id == run_id, T.question_id.in_(part), T.retired.is_(True))
                     .values(in_pool=True, retired=False))
    conn.execute(update(qs).where(qs.run_id == bindparam("b_run"), qs.question_id == bindparam("b_qid")).values(
        retired=False, retired_step=None, pool_size=bindparam("b_pool")),
        [dict(b_run=run_id, b_qid=qid, b_pool=pooled[qid]) for qid in qids])
    return [uid for uid, _, _, _ in chosen]


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
    fresh = [(states[g.question_uid][0], rule.collects(g.k) and g.succeeded(r), r)
             for g in groups for r in g.rollouts if r.replayed_from is None]
    cands = [(qid, r) for qid, ok, r in fresh if ok]
    seen = _existing_texts(conn, run_id, cands)
    rows, collected, duplicates = [], 0, 0
    for qid, ok, r in fresh:
        experience = ok
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
            retired=retired, times_replayed=0, last_replayed_step=None, prediction=r.prediction, gold=r.gold,
            verifier=r.verifier, verifier_version=r.verifier_version,
            verify_timed_out=None if r.verifier is None else r.reason == "timeout",
            verify_reason=None if r.verifier is None else r.reason[:16], origin_run_id=None,
            origin_trajectory_id=None))
    return rows, collected, duplicates


def read_buffer_state(conn: Connection, run_id: str, group_size: int, with_buckets: bool = True) -> BufferState:
    """Buckets by latest k (docs/implementation_details.md) and pool sizes, aggregated by the database; `with_buckets=False`
    reads the counts alone (one aggregate, no pooled uids: the per-step metrics)."""
    qs = QuestionState
    pooled = case((and_(*pooled_filter(run_id)[1:]), 1), else_=0)  # the pool condition without its run clause
    per_k = conn.execute(select(qs.latest_k, func.count(), func.sum(case((qs.retired.is_(True), 1), else_=0)),
                                func.sum(qs.pool_size), func.sum(pooled))
                         .where(qs.run_id == run_id, qs.latest_k.is_not(None)).group_by(qs.latest_k)).all()
    bucket_counts = dict.fromkeys(range(group_size + 1), 0)
    bucket_counts.update({int(k): int(n) for k, n, *_ in per_k})  # a k outside 0..K is shown, not hidden
    totals = dict(pool_questions=sum(int(q or 0) for *_, q in per_k),
                  pool_trajectories=sum(int(p or 0) for *_, p, _ in per_k),
                  retired_questions=sum(int(r or 0) for _, _, r, _, _ in per_k))
    if not with_buckets:
        return BufferState(buckets={}, bucket_counts=bucket_counts, **totals)
    buckets: dict[int, list[str]] = {}
    rows = conn.execute(select(qs.latest_k, qs.slot, qs.uid).where(*pooled_filter(run_id))
                        .order_by(qs.latest_k, qs.slot))  # the partial index's order: no sort
    for k, slot, uid in rows:  # each bucket in slot order, the order replay sampling draws positions in
        members = buckets.setdefault(k, [])
        if slot != len(members):
            raise StoreError(f"pool slots of bucket {k} of run {run_id} are not 0..n-1 (slot {slot} at position "
                             f"{len(members)}; a write outside ExperienceStore?)")
        members.append(uid)
    return BufferState(buckets=buckets, bucket_counts=bucket_counts, **totals)
