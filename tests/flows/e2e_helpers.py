"""Helpers shared by the end-to-end flow tests."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa


def sqlite_rows(db: Path, sql: str, busy_timeout_s: float = 5.0, **params):
    """Rows of one query against a SQLite experience database (engine disposed afterwards). A poll passes a short
    `busy_timeout_s`: a read waiting on the writer's lock (5 s by default) can miss the whole rest of a tiny run."""
    eng = sa.create_engine(f"sqlite:///{db}", connect_args={"timeout": busy_timeout_s})
    with eng.connect() as c:
        rows = c.execute(sa.text(sql), params).all()
    eng.dispose()
    return rows
