"""Replay reads in SQL (SPEC §1.2): drawing the replay questions without reading the whole pool, and
fetching their stored trajectories.

`buffer_state` lists every pooled question; the weighted draw needs only each bucket's size and then
the chosen questions. `pooled_counts` reads the sizes (one GROUP BY), `selection.sample_bucket_positions`
draws positions inside the buckets' uid-sorted lists, and `pooled_uids_at` fetches the uids at those
positions (one statement). Both read the partial index of pooled questions (migration 0004).
`candidate_rows` fetches the chosen questions' trajectories in one statement.
"""

from __future__ import annotations

import functools

from sqlalchemy import Connection, and_, bindparam, func, literal_column, select, union_all

from exgrpo_core.store_engine import StoreError
from exgrpo_core.store_models import QuestionState, Trajectory


def _candidates_statement(uid_match):
    """Each uid's state row (so an unregistered uid shows) left-joined to its pooled trajectories
    generated before `before_step`, through the (run, question, in_pool) index; `step + 0` keeps
    SQLite's planner off the step indexes, which made it scan every trajectory of the run."""
    T, QS = Trajectory, QuestionState
    pooled = and_(T.run_id == QS.run_id, T.question_id == QS.question_id, T.in_pool.is_(True),
                  T.step + literal_column("0") < bindparam("before_step"))
    return (select(QS.uid, T.id, T.token_ids, T.behaviour_logprobs, T.text, T.step, T.entropy, T.times_replayed)
            .select_from(QS).outerjoin(T, pooled).where(QS.run_id == bindparam("run_id"), uid_match)
            .order_by(T.id))


_CANDIDATES = _candidates_statement(QuestionState.uid.in_(bindparam("uids", expanding=True)))
_PG_SQL: dict[str, str] = {}


def candidate_rows(conn: Connection, run_id: str, uids: list[str], before_step: int) -> list[tuple]:
    """(uid, id, token_ids, behaviour_logprobs, text, step, entropy, times_replayed) per pooled
    trajectory of `uids` generated before `before_step`, by id; (uid, None, ...) for a uid without any;
    no row for an unregistered uid.

    On PostgreSQL: one fixed text (uids as one array parameter, so psycopg prepares it once) fetched in
    binary format, so the token / log-prob payloads arrive as bytes, not hex text (half the fetch time).
    """
    params = {"run_id": run_id, "uids": uids, "before_step": before_step}
    if conn.dialect.name != "postgresql":
        return [tuple(r) for r in conn.execute(_CANDIDATES, params)]
    if "candidates" not in _PG_SQL:
        stmt = _candidates_statement(QuestionState.uid == func.any(bindparam("uids")))
        _PG_SQL["candidates"] = str(stmt.compile(dialect=conn.dialect))
    try:
        with conn.connection.driver_connection.cursor(binary=True) as cur:
            return cur.execute(_PG_SQL["candidates"], params).fetchall()
    except Exception as e:  # psycopg errors are not SQLAlchemy's: name the problem here
        raise StoreError(f"reading replay candidates failed: {str(e).strip().splitlines()[0]}") from e


def pooled_filter(run_id) -> tuple:
    """Questions in the replay pool: not retired, with pooled trajectories. Written as the partial
    index's WHERE (literal 0, not a bound parameter) so both planners can prove the index applies."""
    qs = QuestionState
    return qs.run_id == run_id, qs.retired.is_(False), qs.pool_size > literal_column("0")


def code_point_order(dialect: str):
    """uid ordered by code point, as Python's sorted(): byte order of UTF-8, i.e. "C" in PostgreSQL
    (its default collation may sort by language rules) and SQLite's default BINARY."""
    return QuestionState.uid.collate("C") if dialect == "postgresql" else QuestionState.uid


_COUNTS = (select(QuestionState.latest_k, func.count()).where(*pooled_filter(bindparam("run_id")))
           .group_by(QuestionState.latest_k))


def pooled_counts(conn: Connection, run_id: str) -> dict[int, int]:
    """{latest k: pooled questions}: the sizes of `buffer_state(...).buckets`."""
    return {int(k): int(n) for k, n in conn.execute(_COUNTS, {"run_id": run_id})}


@functools.cache
def _ranks_statement(dialect: str, n_buckets: int):
    """UNION ALL over buckets j < n_buckets: (j, rank, uid) of bucket k{j}'s uids ranked in code-point
    order, the first n{j} only, those whose rank is in pos{j}. Built once per shape (compiled cache)."""
    qs, key = QuestionState, code_point_order(dialect)
    parts = []
    for j in range(n_buckets):
        ranked = (select(qs.uid, (func.row_number().over(order_by=key) - 1).label("pos"))
                  .where(*pooled_filter(bindparam("run_id")), qs.latest_k == bindparam(f"k{j}"))
                  .order_by(key).limit(bindparam(f"n{j}")).subquery())
        parts.append(select(literal_column(str(j)), ranked.c.pos, ranked.c.uid)
                     .where(ranked.c.pos.in_(bindparam(f"pos{j}", expanding=True))))
    return union_all(*parts)


def pooled_uids_at(conn: Connection, run_id: str, picks: list[tuple[int, int]]) -> list[str]:
    """The uid at each (k, index) of the code-point-sorted pooled buckets, in the order of `picks`.

    Per bucket, row_number() over the uid order stops at the largest index wanted (LIMIT).
    """
    if not picks:
        return []
    wanted: dict[int, set[int]] = {}
    for k, i in picks:
        wanted.setdefault(k, set()).add(i)
    ks = sorted(wanted)
    params: dict = {"run_id": run_id}
    for j, k in enumerate(ks):
        params.update({f"k{j}": k, f"n{j}": max(wanted[k]) + 1, f"pos{j}": sorted(wanted[k])})
    rows = conn.execute(_ranks_statement(conn.dialect.name, len(ks)), params)
    found = {(ks[int(j)], int(pos)): uid for j, pos, uid in rows}
    missing = [p for p in picks if p not in found]
    if missing:
        raise StoreError(f"the replay pool of run {run_id} changed while sampling (no question at bucket/index "
                         f"{missing[:3]}); sample again")
    return [found[p] for p in picks]
