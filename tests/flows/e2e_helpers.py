"""Helpers shared by the end-to-end flow tests."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa


def sqlite_rows(db: Path, sql: str, **params):
    """Rows of one query against a SQLite experience database (engine disposed afterwards)."""
    eng = sa.create_engine(f"sqlite:///{db}")
    with eng.connect() as c:
        rows = c.execute(sa.text(sql), params).all()
    eng.dispose()
    return rows
