"""Replay reads in SQL (SPEC §1.2): drawing the replay questions without reading the whole pool, and
fetching their stored trajectories.

`buffer_state` lists every pooled question; the weighted draw needs only each bucket's size and then
the chosen questions. `pooled_counts` reads the sizes (one GROUP BY), `selection.sample_bucket_positions`
draws positions inside the buckets' uid-sorted lists, and `pooled_uids_at` fetches the uids at those
positions (one statement). Both read the partial index of pooled questions (migration 0004).
`all_rows` fetches the candidates' payloads in PostgreSQL's binary format.
"""

from __future__ import annotations

from sqlalchemy import Connection, func, literal, literal_column, select, union_all

from exgrpo_core.store_engine import StoreError
from exgrpo_core.store_models import QuestionState


def all_rows(conn: Connection, stmt) -> list[tuple]:
    """The rows of `stmt`; on PostgreSQL fetched in binary format, so bytea payloads arrive as bytes
    instead of hex text (half the time of fetching replay candidates at 1M trajectories)."""
    if conn.dialect.name != "postgresql":
        return [tuple(r) for r in conn.execute(stmt)]
    sql = stmt.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
    try:
        with conn.connection.driver_connection.cursor(binary=True) as cur:
            return cur.execute(sql.string, sql.params).fetchall()
    except Exception as e:  # psycopg errors are not SQLAlchemy's: name the problem here
        raise StoreError(f"reading rows failed: {str(e).strip().splitlines()[0]}") from e


def pooled_filter(run_id: str) -> tuple:
    """Questions in the replay pool: not retired, with pooled trajectories. Written as the partial
    index's WHERE (literal 0, not a bound parameter) so both planners can prove the index applies."""
    qs = QuestionState
    return qs.run_id == run_id, qs.retired.is_(False), qs.pool_size > literal_column("0")


def code_point_order(conn: Connection):
    """uid ordered by code point, as Python's sorted(): byte order of UTF-8, i.e. "C" in PostgreSQL
    (its default collation may sort by language rules) and SQLite's default BINARY."""
    return QuestionState.uid.collate("C") if conn.dialect.name == "postgresql" else QuestionState.uid


def pooled_counts(conn: Connection, run_id: str) -> dict[int, int]:
    """{latest k: pooled questions}: the sizes of `buffer_state(...).buckets`."""
    qs = QuestionState
    rows = conn.execute(select(qs.latest_k, func.count()).where(*pooled_filter(run_id)).group_by(qs.latest_k))
    return {int(k): int(n) for k, n in rows}


def pooled_uids_at(conn: Connection, run_id: str, picks: list[tuple[int, int]]) -> list[str]:
    """The uid at each (k, index) of the code-point-sorted pooled buckets, in the order of `picks`.

    Per bucket, row_number() over the uid order stops at the largest index wanted (LIMIT).
    """
    if not picks:
        return []
    qs, key = QuestionState, code_point_order(conn)
    wanted: dict[int, set[int]] = {}
    for k, i in picks:
        wanted.setdefault(k, set()).add(i)
    parts = []
    for k, idx in sorted(wanted.items()):
        ranked = (select(qs.uid, (func.row_number().over(order_by=key) - 1).label("pos"))
                  .where(*pooled_filter(run_id), qs.latest_k == k).order_by(key).limit(max(idx) + 1).subquery())
        parts.append(select(literal(k).label("k"), ranked.c.pos, ranked.c.uid).where(ranked.c.pos.in_(sorted(idx))))
    found = {(int(k), int(pos)): uid for k, pos, uid in conn.execute(union_all(*parts))}
    missing = [p for p in picks if p not in found]
    if missing:
        raise StoreError(f"the replay pool of run {run_id} changed while sampling (no question at bucket/index "
                         f"{missing[:3]}); sample again")
    return [found[p] for p in picks]
