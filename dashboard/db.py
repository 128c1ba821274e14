"""Read-only connections to the experience database for the dashboard.

SQLite is opened through a file URI with `mode=ro` (plus `PRAGMA query_only`), so the dashboard can
never write, and runs no migration; the store keeps SQLite in WAL mode, so these readers never block
a training run that writes, nor it them. PostgreSQL sessions start with
`default_transaction_read_only=on` and a statement timeout, so a slow page cannot hold locks for long.
"""

from __future__ import annotations

import functools
import os
import urllib.parse
from pathlib import Path

from sqlalchemy import Engine, create_engine, event, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from exgrpo_core.store.engine import StoreError, mask_url, parse_url, resolve_db_url

ENV_DB_URL = "EXGRPO_DB_URL"
ENV_MLFLOW_URI = "MLFLOW_TRACKING_URI"
DEFAULT_RUN_DIR = "runs/exgrpo"  # where `exgrpo train` puts its SQLite file without --config / db_url
STATEMENT_TIMEOUT_MS = 30_000
CONNECT_TIMEOUT_S = 5


class DashboardError(RuntimeError):
    """Something the page explains to the user instead of showing a traceback."""


def database_url() -> str:
    """EXGRPO_DB_URL (set by `exgrpo dashboard`), else training's default SQLite file."""
    return resolve_db_url(None, DEFAULT_RUN_DIR)


def reason(e: BaseException) -> str:
    """The first line of a database error's own message (no SQL, no traceback)."""
    return (str(getattr(e, "orig", None) or e).strip().splitlines() or [type(e).__name__])[0]


@functools.lru_cache(maxsize=16)
def readonly_engine(url: str) -> Engine:
    """A read-only engine for `url`, connected once; DashboardError explains why it cannot be opened.

    Failures are not cached (lru_cache keeps only returned values), so a database created later is
    picked up on the next page load.
    """
    try:
        parsed = parse_url(url)
    except StoreError as e:
        raise DashboardError(str(e)) from None
    if parsed.get_backend_name() == "sqlite":
        engine = _sqlite_readonly(parsed.database)
    else:
        options = f"-c default_transaction_read_only=on -c statement_timeout={STATEMENT_TIMEOUT_MS}"
        engine = create_engine(parsed, pool_pre_ping=True, pool_size=4,
                               connect_args={"connect_timeout": CONNECT_TIMEOUT_S, "options": options})
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except SQLAlchemyError as e:
        engine.dispose()
        raise DashboardError(f"cannot connect to the experience database at {mask_url(parsed)}: {reason(e)}. "
                             "Check the URL (--db-url / EXGRPO_DB_URL) and that the server is running.") from None
    return engine


def _sqlite_readonly(database: str | None) -> Engine:
    if database in (None, "", ":memory:"):
        raise DashboardError("an in-memory SQLite database cannot be shared with a dashboard: "
                             "train with a file (sqlite:///path/experience.db) or PostgreSQL")
    path = Path(database).expanduser().resolve()
    if not path.is_file():
        raise DashboardError(f"no experience database at {path} yet: start a training run "
                             "(`exgrpo train --config ...`) or point the dashboard at one with --db-url")
    uri = f"file:{urllib.parse.quote(str(path))}?mode=ro&uri=true"
    engine = create_engine(make_url(f"sqlite:///{uri}"))

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA query_only=1")
        cur.execute("PRAGMA busy_timeout=5000")  # a checkpointing writer holds the lock for milliseconds
        cur.close()

    return engine


def has_schema(engine: Engine) -> bool:
    """True once training has created the tables (the dashboard never migrates)."""
    try:
        return inspect(engine).has_table("runs")
    except SQLAlchemyError as e:
        raise DashboardError(f"cannot read the schema of {mask_url(engine.url)}: {reason(e)}") from None


def mlflow_uri() -> str | None:
    """MLFLOW_TRACKING_URI (set by `exgrpo dashboard`), else None (results come from the database only)."""
    return os.environ.get(ENV_MLFLOW_URI) or None
