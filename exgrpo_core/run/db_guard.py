"""Whether the SQLite experience database a run writes is still the file it opened, and intact.

SQLite keeps writing through its open file handle when the file is deleted or replaced under a live run
(the rows go to a file nobody can open), and a damaged page is only found when it is read. So a run checks,
after each step (`check`: the file is there, the same file, an SQLite header) and before each checkpoint and
its end (`check(full=True)`: also `PRAGMA quick_check` on a connection of its own); a failed check raises
`DatabaseLostError`, one line. PostgreSQL and in-memory databases are not checked here.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from sqlalchemy.engine import make_url

from exgrpo_core.store.engine import StoreError

HEADER = b"SQLite format 3\x00"


class DatabaseLostError(StoreError):
    """The run's SQLite file was deleted, replaced or damaged while the run trained."""


class DatabaseGuard:
    def __init__(self, db_url: str):
        url = make_url(db_url)
        file = url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:")
        self.path = Path(url.database).expanduser().resolve() if file else None
        self.identity = self._identity() if self.path else None

    def _identity(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return st.st_dev, st.st_ino

    def _lost(self, what: str) -> DatabaseLostError:
        return DatabaseLostError(f"the experience database {self.path} {what} while the run trained")

    def check(self, full: bool = False) -> None:
        """Raise DatabaseLostError when the file is gone, another file, not SQLite, or (full) damaged."""
        if self.path is None or self.identity is None:
            return
        now = self._identity()
        if now is None:
            raise self._lost("was deleted")
        if now != self.identity:
            raise self._lost("was replaced by another file")
        with open(self.path, "rb") as f:
            head = f.read(len(HEADER))
        if head != HEADER:
            raise self._lost("was overwritten (no SQLite header any more)")
        if full:
            problem = quick_check(self.path)
            if problem:
                raise self._lost(f"is damaged (quick_check: {problem})")


def quick_check(path: Path) -> str | None:
    """SQLite's `PRAGMA quick_check` on its own read-only connection: None when ok, else its first finding."""
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
        try:
            rows = conn.execute("PRAGMA quick_check").fetchall()
        finally:
            conn.close()
    except sqlite3.OperationalError:  # busy, or gone between the checks: not a finding
        return None
    except sqlite3.DatabaseError as e:  # malformed, not a database
        return str(e) or type(e).__name__
    first = str(rows[0][0]) if rows else "no answer"
    return None if first == "ok" else first
