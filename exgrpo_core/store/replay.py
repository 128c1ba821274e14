"""Replay reads in SQL (docs/implementation_details.md): drawing the replay questions without reading the whole pool,
keeping the pool slots that make that possible, and fetching the chosen questions' trajectories.

Every pooled question (not retired, pool_size > 0) holds a dense `slot` 0..n-1 inside its bucket
(latest k); `buffer_state` lists each bucket in slot order. The weighted draw needs only the
bucket sizes (`bucket_sizes`: max(slot) + 1, one index probe per bucket) and then the questions at
the drawn positions (`pooled_uids_at`: index lookups), both on the partial index of migration 0005,
so a draw costs O(log pool), not O(bucket). `move_slots` keeps the slots dense when a buffer update
moves questions (swap-remove: the bucket's last member fills a hole, newcomers append) and logs the
old slots so that a rollback restores them exactly (`restore_slots`).
`candidate_rows` fetches the chosen questions' trajectories in one statement; `payload_rows` the
log-probs and text of the few trajectories replayed.
"""

from __future__ import annotations

import functools
from collections import Counter

from sqlalchemy import Connection, and_, bindparam, func, insert, literal_column, select, union_all, update

from exgrpo_core.store.engine import StoreError
from exgrpo_core.store.tables import PoolSlotLog, QuestionState, Trajectory

CHUNK = 1000  # rows per executemany batch, IN-list items (SQLite caps bound parameters)


def _chunks(items: list, size: int = CHUNK):
    for i in range(0, len(items), size):
        yield items[i:i + size]


# ---- candidate trajectories --------------------------------------------------------------------
def _candidates_statement(uid_match, payload: bool):
    """Each uid's state row (so an unregistered uid shows) left-joined to its pooled trajectories
    generated before `before_step`, through the (run, question, in_pool) index; `step + 0` keeps
    SQLite's planner off the step indexes, which made it scan every trajectory of the run."""
    T, QS = Trajectory, QuestionState
    pooled = and_(T.run_id == QS.run_id, T.question_id == QS.question_id, T.in_pool.is_(True),
                  T.step + literal_column("0") < bindparam("before_step"))
    cols = [QS.uid, T.id, T.token_ids, T.step, T.entropy, T.times_replayed]
    cols += [T.behaviour_logprobs, T.text] if payload else []
    return (select(*cols).select_from(QS).outerjoin(T, pooled).where(QS.run_id == bindparam("run_id"), uid_match)
            .order_by(T.id))


_PG_SQL: dict[tuple, str] = {}


def _pg_fetch(conn: Connection, key: tuple, build, params: dict, what: str) -> list[tuple]:
    """One fixed text per `key` (arrays as one parameter, so psycopg prepares it once), fetched in
    binary format so the token / log-prob payloads arrive as bytes, not hex text (half the fetch time)."""
    if key not in _PG_SQL:
        _PG_SQL[key] = str(build().compile(dialect=conn.dialect))
    try:
        with conn.connection.driver_connection.cursor(binary=True) as cur:
            return cur.execute(_PG_SQL[key], params).fetchall()
    except Exception as e:  # psycopg errors are not SQLAlchemy's: name the problem here
        raise StoreError(f"{what} failed: {str(e).strip().splitlines()[0]}") from e


def candidate_rows(conn: Connection, run_id: str, uids: list[str], before_step: int,
                   payload: bool = True) -> list[tuple]:
    """(uid, id, token_ids, step, entropy, times_replayed[, behaviour_logprobs, text]) per pooled
    trajectory of `uids` generated before `before_step`, by id; (uid, None, ...) for a uid without any;
    no row for an unregistered uid. The payload columns only with `payload`."""
    params = {"run_id": run_id, "uids": uids, "before_step": before_step}
    if conn.dialect.name != "postgresql":
        stmt = _candidates_statement(QuestionState.uid.in_(bindparam("uids", expanding=True)), payload)
        return [tuple(r) for r in conn.execute(stmt, params)]
    return _pg_fetch(conn, ("candidates", payload), lambda: _candidates_statement(
        QuestionState.uid == func.any(bindparam("uids")), payload), params, "reading replay candidates")


def _payload_statement(id_match):
    """By primary key only: given run_id too, SQLite's planner scanned the run's (run, step) index."""
    T = Trajectory
    return select(T.id, T.run_id, T.behaviour_logprobs, T.text, T.reward).where(id_match)


def payload_rows(conn: Connection, run_id: str, ids: list[int]) -> list[tuple]:
    """(id, behaviour_logprobs, text, reward) of these trajectories of the run (absent ids give no row)."""
    params = {"ids": ids}
    if conn.dialect.name != "postgresql":
        rows = conn.execute(_payload_statement(Trajectory.id.in_(bindparam("ids", expanding=True))), params)
    else:
        rows = _pg_fetch(conn, ("payloads",), lambda: _payload_statement(Trajectory.id == func.any(bindparam("ids"))),
                         params, "reading replayed trajectories")
    return [(tid, lps, text, reward) for tid, run, lps, text, reward in rows if run == run_id]


# ---- sampling on slots -------------------------------------------------------------------------
def pooled_filter(run_id) -> tuple:
    """Questions in the replay pool: not retired, with pooled trajectories. Written as the partial
    index's WHERE (literal 0, not a bound parameter) so both planners can prove the index applies."""
    qs = QuestionState
    return qs.run_id == run_id, qs.retired.is_(False), qs.pool_size > literal_column("0")


@functools.cache
def _sizes_statement(n_buckets: int):
    """UNION ALL over j < n_buckets: (j, max slot of bucket k{j}), each a backward index probe."""
    qs = QuestionState
    return union_all(*[select(literal_column(str(j)), func.max(qs.slot)).where(
        *pooled_filter(bindparam("run_id")), qs.latest_k == bindparam(f"k{j}")) for j in range(n_buckets)])


# PostgreSQL: one fixed text each, arrays as parameters (prepared once by psycopg, no re-rendering)
_POOLED_SQL = "qs.run_id = %(run_id)s AND qs.retired IS false AND qs.pool_size > 0"
_PG_SIZES = ("SELECT b.k, (SELECT max(qs.slot) FROM question_states qs WHERE " + _POOLED_SQL
             + " AND qs.latest_k = b.k) FROM unnest(%(ks)s::int[]) AS b(k)")
_PG_MEMBERS = ("SELECT p.k, p.s, qs.uid, qs.question_id FROM unnest(%(ks)s::int[], %(ss)s::int[]) AS p(k, s) "
               "JOIN question_states qs ON " + _POOLED_SQL + " AND qs.latest_k = p.k AND qs.slot = p.s")


def _pg_rows(conn: Connection, sql: str, params: dict, what: str) -> list[tuple]:
    try:
        with conn.connection.driver_connection.cursor() as cur:
            return cur.execute(sql, params).fetchall()
    except Exception as e:  # psycopg errors are not SQLAlchemy's: name the problem here
        raise StoreError(f"{what} failed: {str(e).strip().splitlines()[0]}") from e


def bucket_sizes(conn: Connection, run_id: str, ks: list[int]) -> dict[int, int]:
    """{k: pooled questions in bucket k} for each k of `ks`: max(slot) + 1 (slots are dense)."""
    ks = sorted(set(ks))
    if not ks:
        return {}
    if conn.dialect.name == "postgresql":
        rows = _pg_rows(conn, _PG_SIZES, {"run_id": run_id, "ks": ks}, "reading bucket sizes")
        return {int(k): 0 if top is None else int(top) + 1 for k, top in rows}
    rows = conn.execute(_sizes_statement(len(ks)), {"run_id": run_id, **{f"k{j}": k for j, k in enumerate(ks)}})
    return {ks[int(j)]: 0 if top is None else int(top) + 1 for j, top in rows}


def _sqlite_members_sql(sizes: list[int]) -> str:
    """UNION ALL over buckets: (k, slot, uid, question_id) at `sizes[j]` slots of bucket j, through the
    slot index by name (SQLite's planner otherwise scans the bucket by (run, retired, k))."""
    return " UNION ALL ".join(
        "SELECT latest_k, slot, uid, question_id FROM question_states INDEXED BY ix_question_states_run_pool_k_slot "
        "WHERE run_id = ? AND retired IS 0 AND pool_size > 0 AND latest_k = ? "
        f"AND slot IN ({', '.join('?' * n)})" for n in sizes)


def members_at(conn: Connection, run_id: str, wanted: dict[int, set[int]]) -> dict[tuple[int, int], tuple[str, int]]:
    """{(k, slot): (uid, question_id)} of the pooled questions at these slots (one statement)."""
    ks = sorted(k for k in wanted if wanted[k])
    if not ks:
        return {}
    if conn.dialect.name == "postgresql":
        pairs = [(k, slot) for k in ks for slot in sorted(wanted[k])]
        rows = _pg_rows(conn, _PG_MEMBERS, {"run_id": run_id, "ks": [k for k, _ in pairs],
                                            "ss": [slot for _, slot in pairs]}, "reading pooled questions")
        return {(int(k), int(slot)): (uid, qid) for k, slot, uid, qid in rows}
    params: list = []
    for k in ks:
        params += [run_id, k, *sorted(wanted[k])]
    rows = conn.exec_driver_sql(_sqlite_members_sql([len(wanted[k]) for k in ks]), tuple(params))
    return {(int(k), int(slot)): (uid, qid) for k, slot, uid, qid in rows}


def pooled_uids_at(conn: Connection, run_id: str, picks: list[tuple[int, int]]) -> list[str]:
    """The uid at each (k, slot) of the pooled buckets, in the order of `picks`."""
    if not picks:
        return []
    wanted: dict[int, set[int]] = {}
    for k, i in picks:
        wanted.setdefault(k, set()).add(i)
    found = members_at(conn, run_id, wanted)
    missing = [p for p in picks if p not in found]
    if missing:
        raise StoreError(f"the replay pool of run {run_id} changed while sampling (no question at bucket/slot "
                         f"{missing[:3]}); sample again")
    return [found[p][0] for p in picks]


def pooled_newest(conn: Connection, run_id: str, ks: list[int], before_step: int) -> dict[int, list[tuple[str, int]]]:
    """{k: [(uid, step of its newest pooled trajectory generated before `before_step`)]} for the pooled
    questions of buckets `ks`, each bucket in slot order; a question without such a trajectory is left out.
    Reads the whole of these buckets (the age rules weigh every member), one statement."""
    qs, T = QuestionState, Trajectory
    if not ks:
        return {}
    rows = conn.execute(
        select(qs.latest_k, qs.slot, qs.uid, func.max(T.step)).join(
            T, and_(T.run_id == qs.run_id, T.question_id == qs.question_id, T.in_pool.is_(True),
                    T.step < before_step))
        .where(*pooled_filter(run_id), qs.latest_k.in_(sorted(set(ks))))
        .group_by(qs.latest_k, qs.slot, qs.uid).order_by(qs.latest_k, qs.slot))
    out: dict[int, list[tuple[str, int]]] = {}
    for k, _, uid, newest in rows:
        out.setdefault(int(k), []).append((uid, int(newest)))
    return out


# ---- keeping the slots dense -------------------------------------------------------------------
def plan_slot_moves(sizes: dict[int, int], leaving: list[tuple[int, int, int]], joining: list[tuple[int, str, int]],
                    tail: dict[tuple[int, int], int]) -> dict[int, tuple[int | None, int | None]]:
    """Swap-remove and append on bucket arrays of these sizes: {question_id: (old slot, new slot)}.

    leaving: (k, slot, question_id) leaving bucket k, removed in descending slot order, each hole
    filled by the bucket's current last member; joining: (k, uid, question_id) appended in (k, uid)
    order after the removals (a question changing bucket is in both); tail: {(k, slot): question_id}
    of each bucket's top len(leaving in k) slots. None = not pooled. Only changed questions returned.
    """
    out: dict[int, tuple[int | None, int | None]] = {}
    at = dict(tail)
    sizes = dict(sizes)

    def move(qid: int, old: int | None, new: int | None) -> None:
        out[qid] = (out[qid][0] if qid in out else old, new)

    for k, slot, qid in leaving:
        if at.setdefault((k, slot), qid) != qid or not 0 <= slot < sizes.get(k, 0):
            raise StoreError(f"pool slots of bucket {k} are inconsistent: question {qid} at slot {slot}, "
                             f"bucket size {sizes.get(k, 0)}")
    for k, slot, qid in sorted(leaving, key=lambda x: (x[0], -x[1])):
        last = sizes[k] - 1
        move(qid, slot, None)
        if slot != last:
            if (k, last) not in at:
                raise StoreError(f"pool slots of bucket {k} are not dense: nothing at slot {last}")
            filler = at[(k, last)]
            move(filler, last, slot)
            at[(k, slot)] = filler
        del at[(k, last)]
        sizes[k] = last
    for k, _, qid in sorted(joining):
        move(qid, None, sizes.get(k, 0))
        sizes[k] = sizes.get(k, 0) + 1
    return {q: (old, new) for q, (old, new) in out.items() if old != new}


def move_slots(conn: Connection, run_id: str, step: int, leaving: list[tuple[int, int, int]],
               joining: list[tuple[int, str, int]]) -> None:
    """Apply `plan_slot_moves` in the caller's transaction and log each old slot under `step`.

    Reads the buckets before the caller changes latest_k / pool_size / retired of these questions.
    """
    if not leaving and not joining:
        return
    sizes = bucket_sizes(conn, run_id, [k for k, _, _ in leaving] + [k for k, _, _ in joining])
    n_out = Counter(k for k, _, _ in leaving)
    tail = members_at(conn, run_id, {k: set(range(sizes[k] - n, sizes[k])) for k, n in n_out.items()})
    moves = plan_slot_moves(sizes, leaving, joining, {key: qid for key, (_, qid) in tail.items()})
    qs = QuestionState
    stmt = update(qs).where(qs.run_id == bindparam("b_run"), qs.question_id == bindparam("b_qid")).values(
        slot=bindparam("b_slot"))
    items = sorted(moves.items())
    for part in _chunks(items):
        conn.execute(stmt, [dict(b_run=run_id, b_qid=q, b_slot=new) for q, (_, new) in part])
        conn.execute(insert(PoolSlotLog), [dict(run_id=run_id, step=step, question_id=q, old_slot=old)
                                           for q, (old, _) in part])


def restore_slots(conn: Connection, run_id: str, step: int, logged_after: int) -> None:
    """Slots as at the end of `step` (rollback), after the question states were rebuilt.

    From the undo log when it covers every step after `step`: each question takes the old slot of
    its first logged change after `step`. Before the log starts (a run older than migration 0005),
    every bucket is renumbered in code-point uid order, the order that code listed buckets in.
    """
    L, qs = PoolSlotLog, QuestionState
    if step >= logged_after:
        first: dict[int, int | None] = {}
        for qid, old in conn.execute(select(L.question_id, L.old_slot).where(L.run_id == run_id, L.step > step)
                                     .order_by(L.id)):
            first.setdefault(qid, old)
        stmt = update(qs).where(qs.run_id == bindparam("b_run"), qs.question_id == bindparam("b_qid")).values(
            slot=bindparam("b_slot"))
        for part in _chunks(sorted(first.items())):
            conn.execute(stmt, [dict(b_run=run_id, b_qid=q, b_slot=s) for q, s in part])
    else:
        renumber_slots(conn, run_id)
    conn.execute(L.__table__.delete().where(L.run_id == run_id, L.step > step))


def renumber_slots(conn: Connection, run_id: str) -> None:
    """Slots 0..n-1 per bucket in code-point uid order; None outside the pool (as migration 0005)."""
    qs = QuestionState
    members: dict[int, list[tuple[str, int]]] = {}
    for k, uid, qid in conn.execute(select(qs.latest_k, qs.uid, qs.question_id).where(*pooled_filter(run_id))):
        members.setdefault(k, []).append((uid, qid))
    conn.execute(update(qs).where(qs.run_id == run_id).values(slot=None))
    stmt = update(qs).where(qs.run_id == bindparam("b_run"), qs.question_id == bindparam("b_qid")).values(
        slot=bindparam("b_slot"))
    rows = [dict(b_run=run_id, b_qid=qid, b_slot=i) for k in members for i, (_, qid) in enumerate(sorted(members[k]))]
    for part in _chunks(rows):
        conn.execute(stmt, part)
