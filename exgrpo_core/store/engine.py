"""Connection side of the experience database: URL resolution and checks, engine setup, Alembic upgrades.

SQLite runs in WAL mode with foreign keys on and a busy timeout, so the dashboard can read while
training writes; write transactions take the lock up front (`BEGIN IMMEDIATE`). PostgreSQL goes
through psycopg 3 (`postgresql://` URLs are mapped to `postgresql+psycopg://`).
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine, event, inspect, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError
from sqlalchemy.pool import StaticPool

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
ENV_URL = "EXGRPO_DB_URL"
SQLITE_BUSY_TIMEOUT_MS = 30_000
PG_CONNECT_TIMEOUT_S = 10
_PG_MIGRATION_LOCK = 0x45784752  # advisory lock key ("ExGR"): one migrator at a time per database


class StoreError(RuntimeError):
    """The experience database cannot be used as asked (bad URL, unreachable server, bad input)."""


def mask_url(url: str | URL) -> str:
    """The URL as text with its password replaced by ***."""
    if isinstance(url, URL):
        return url.render_as_string(hide_password=True)
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", str(url))


def resolve_db_url(configured: str | None, run_dir: str | Path) -> str:
    """`configured`, else env EXGRPO_DB_URL, else an SQLite file `experience.db` in the run dir (absolute).
    A configured URL with a masked password (`user:***@`, as Prefect parameters carry it) takes the
    password from EXGRPO_DB_URL when that names the same database, else none (libpq's pass file)."""
    if configured:
        from exgrpo_core.config.redact import reveal_url

        return reveal_url(configured, ENV_URL)
    if os.environ.get(ENV_URL):
        return os.environ[ENV_URL]
    return f"sqlite:///{Path(run_dir).expanduser().resolve() / 'experience.db'}"


def parse_url(url: str) -> URL:
    """Parse and check a database URL: SQLite (file or memory) or PostgreSQL through psycopg 3."""
    try:
        parsed = make_url(url)
    except ArgumentError as e:
        raise StoreError(f"invalid database URL {mask_url(url)!r}: expected e.g. sqlite:///path/experience.db "
                         "or postgresql+psycopg://user@host:5432/db") from e
    backend, _, driver = parsed.drivername.partition("+")  # no dialect import: unknown names must not crash
    if backend == "postgres":  # the Heroku-style alias
        parsed, backend = parsed.set(drivername="postgresql+psycopg"), "postgresql"
    if backend == "postgresql" and parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    elif backend == "postgresql" and driver != "psycopg":
        raise StoreError(f"unsupported PostgreSQL driver {driver!r} in {mask_url(parsed)}: use postgresql+psycopg://")
    if backend not in ("sqlite", "postgresql"):
        raise StoreError(f"unknown database dialect {parsed.drivername!r} in {mask_url(parsed)}: "
                         "use sqlite:///path/experience.db or postgresql+psycopg://user@host:5432/db")
    if backend == "sqlite" and parsed.database not in (None, "", ":memory:"):
        folder = Path(parsed.database).expanduser().resolve().parent
        if not folder.is_dir():
            raise StoreError(f"SQLite database folder does not exist: {folder} (from {mask_url(parsed)})")
    return parsed


def create_store_engine(url: URL) -> Engine:
    """An engine for a checked URL, connected once so an unreachable server fails here, by name."""
    try:
        if url.get_backend_name() == "sqlite":
            engine = _sqlite_engine(url)
        else:
            engine = create_engine(url, pool_pre_ping=True, connect_args={"connect_timeout": PG_CONNECT_TIMEOUT_S})
    except (NoSuchModuleError, ArgumentError) as e:
        raise StoreError(f"cannot create a database engine for {mask_url(url)}: {e}") from e
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except SQLAlchemyError as e:
        engine.dispose()
        reason = str(getattr(e, "orig", None) or e).strip().splitlines()[0]
        raise StoreError(f"cannot connect to the experience database at {mask_url(url)}: {reason}") from e
    return engine


def _sqlite_engine(url: URL) -> Engine:
    memory = url.database in (None, "", ":memory:")
    engine = create_engine(url, poolclass=StaticPool) if memory else create_engine(url)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record) -> None:
        dbapi_conn.isolation_level = None  # SQLAlchemy emits BEGIN itself (see _on_begin)
        cur = dbapi_conn.cursor()
        if not memory:
            cur.execute("PRAGMA journal_mode=WAL")  # readers never block the writer, nor it them
            cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # A write transaction takes the write lock at once, so it waits (busy timeout) instead of
        # failing when it upgrades from a read lock while another process writes.
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("write") else "BEGIN")

    return engine


@contextmanager
def write_transaction(engine: Engine, what: str) -> Iterator[Connection]:
    """One all-or-nothing write transaction; database errors become StoreError naming `what`."""
    try:
        with engine.connect().execution_options(write=True) as conn, conn.begin():
            yield conn
    except SQLAlchemyError as e:
        reason = str(getattr(e, "orig", None) or e).strip().splitlines()[0]
        raise StoreError(f"{what} failed on {mask_url(engine.url)}: {reason}") from e


@contextmanager
def read_connection(engine: Engine, what: str) -> Iterator[Connection]:
    """A connection for reads (one consistent snapshot); database errors become StoreError."""
    try:
        with engine.connect() as conn, conn.begin():
            yield conn
    except SQLAlchemyError as e:
        reason = str(getattr(e, "orig", None) or e).strip().splitlines()[0]
        raise StoreError(f"{what} failed on {mask_url(engine.url)}: {reason}") from e


def _alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    return cfg


def head_revision() -> str:
    """The newest migration revision shipped with this package."""
    head = ScriptDirectory.from_config(_alembic_config()).get_current_head()
    if head is None:
        raise StoreError(f"no migrations found in {MIGRATIONS_DIR} (broken installation?)")
    return head


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at (None for an empty database)."""
    with read_connection(engine, "reading the schema revision") as conn:
        return MigrationContext.configure(conn).get_current_revision()


def check_schema(engine: Engine) -> str | None:
    """The database's revision (None: no schema yet), after one StoreError line for a database this version
    cannot use: a revision it does not ship (a newer ExGRPO's, another application's migrations), or
    another application's tables and no schema of ours."""
    from exgrpo_core.store.tables import Base

    with read_connection(engine, "reading the schema revision") as conn:
        current = MigrationContext.configure(conn).get_current_revision()
        tables = {t for t in inspect(conn).get_table_names() if not t.startswith("sqlite_")}
    where = f"the experience database {mask_url(engine.url)}"
    if current is not None:
        known = {r.revision for r in ScriptDirectory.from_config(_alembic_config()).walk_revisions()}
        if current not in known:
            raise StoreError(f"{where} is at schema revision {current!r}, which this ExGRPO does not know (its "
                             f"newest is {head_revision()!r}): a newer ExGRPO wrote it, or another application "
                             "did; upgrade ExGRPO or point run.db_url at another database")
        return current
    foreign = sorted(tables - set(Base.metadata.tables))
    if foreign and not tables & set(Base.metadata.tables):
        more = f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
        raise StoreError(f"{where} holds another application's tables ({', '.join(foreign[:5])}{more}) and no "
                         "ExGRPO schema: point run.db_url at an empty database or an ExGRPO one")
    return None


def upgrade_schema(engine: Engine) -> str:
    """Alembic `upgrade head` in one transaction (PostgreSQL: under an advisory lock); returns the head."""
    head = head_revision()
    if check_schema(engine) == head:
        return head
    cfg = _alembic_config()
    with write_transaction(engine, "upgrading the schema") as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_MIGRATION_LOCK})
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
    return head


@contextmanager
def scratch_postgres_database(server_url: str, prefix: str, options: str = "") -> Iterator[str]:
    """URL of a new, empty database on the PostgreSQL server of `server_url`, dropped on exit (tests,
    benchmarks). `options`: more CREATE DATABASE clauses (e.g. a locale). Fails, never skips, when
    the server is unreachable."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = create_engine(make_url(server_url), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}" {options}'.rstrip()))
        try:
            yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()
