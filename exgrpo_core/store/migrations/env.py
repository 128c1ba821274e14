"""Alembic environment of the experience database, configured in code (no alembic.ini needed).

`exgrpo_core.store.engine.upgrade_schema` passes an open connection in `config.attributes["connection"]`;
the `alembic` command line (for writing new revisions) may instead set `sqlalchemy.url`.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from exgrpo_core.store.tables import Base

config = context.config
target_metadata = Base.metadata


def _run(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",  # SQLite has no ALTER for most changes
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_engine(config.get_main_option("sqlalchemy.url"))
    with engine.connect() as conn:
        _run(conn)
        conn.commit()
    engine.dispose()


if context.is_offline_mode():
    raise RuntimeError("offline (--sql) migrations are not supported; run `exgrpo db upgrade`")
run_migrations_online()
