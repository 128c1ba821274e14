"""Inter-process locks: a blocking file lock for one-time creation, and the one-process-per-run lock.

Both are kernel locks (`flock` on a file, a PostgreSQL session advisory lock), so they are released
when the holding process dies, however it dies: a killed run never leaves a stale lock behind.
`RunLock` refuses a second holder at once, with one line naming the first (pid, host, since when).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class RunLockedError(RuntimeError):
    """Another live process holds the run; the message names it and what to do."""


def holder_label() -> str:
    """Who this process is, for the other side of a refused lock: `pid P on HOST since HH:MM:SS`."""
    return f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}"


@contextmanager
def file_lock(path: str | Path) -> Iterator[None]:
    """Hold an exclusive `flock` on `path` (created if missing) for the block; waits for other holders."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _advisory_key(name: str) -> int:
    """A signed 64-bit advisory lock key for a run name (stable across processes and machines)."""
    return int.from_bytes(hashlib.sha256(f"exgrpo-run:{name}".encode()).digest()[:8], "big", signed=True)


class RunLock:
    """Exactly one process per run: `RunLock.file(run_dir, name)` (SQLite) or `.postgres(engine, name)`.

    Raises RunLockedError when another process holds it; `release()` (or the process's death) frees it.
    """

    def __init__(self, release):
        self._release = release

    def release(self) -> None:
        if self._release is not None:
            self._release()
            self._release = None

    @classmethod
    def file(cls, run_dir: str | Path, name: str) -> "RunLock":
        path = Path(run_dir) / ".lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise RunLockedError(f"run '{name}' is already running ({holder}; lock {path}): wait for it to end, "
                                 "stop it, or set run.name to start another run") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, holder_label().encode(), 0)
        return cls(lambda: os.close(fd))

    @classmethod
    def postgres(cls, engine, name: str) -> "RunLock":
        """A session advisory lock on a dedicated connection, labelled with the holder (application_name)."""
        from sqlalchemy import text

        key = _advisory_key(name)
        conn = engine.connect()
        try:
            conn.execute(text("select set_config('application_name', :label, false)"),
                         {"label": f"exgrpo run {name}: {holder_label()}"[:63]})
            got = conn.execute(text("select pg_try_advisory_lock(:k)"), {"k": key}).scalar()
            if not got:
                holder = conn.execute(text(
                    "select a.application_name, a.client_addr from pg_locks l join pg_stat_activity a "
                    "on a.pid = l.pid where l.locktype = 'advisory' and l.granted and "
                    "((l.classid::bigint << 32) | l.objid::bigint) = (:k)::bigint"), {"k": key}).first()
                who = (f"{holder[0]} (client {holder[1] or 'local'})" if holder else "another process")
                raise RunLockedError(f"run '{name}' is already running ({who}): wait for it to end, stop it, "
                                     "or set run.name to start another run")
            conn.commit()
        except BaseException:
            conn.close()
            raise

        def release() -> None:
            try:
                conn.execute(text("select pg_advisory_unlock(:k)"), {"k": key})
                conn.commit()
            finally:
                conn.close()
        return cls(release)


_HELD: dict[str, RunLock] = {}


def lock_run(run_dir: str | Path, name: str, db_url: str) -> RunLock:
    """This process's lock on the run in `run_dir` (taken once; idempotent): a PostgreSQL advisory lock on
    the run's name when the experience database is PostgreSQL, else a file lock `run_dir/.lock`."""
    key = str(Path(run_dir).resolve())
    if key not in _HELD:
        if db_url.startswith("postgresql"):
            from exgrpo_core.store.engine import create_store_engine, parse_url

            engine = create_store_engine(parse_url(db_url))
            try:
                lock = RunLock.postgres(engine, name)
            except BaseException:
                engine.dispose()
                raise
            inner = lock._release
            lock._release = lambda: (inner(), engine.dispose())
        else:
            lock = RunLock.file(run_dir, name)
        _HELD[key] = lock
    return _HELD[key]


def holds(run_dir: str | Path) -> bool:
    """Whether this process holds the lock on the run in `run_dir`."""
    return str(Path(run_dir).resolve()) in _HELD


def unlock_run(run_dir: str | Path) -> None:
    """Release this process's lock on the run in `run_dir`, if it holds one."""
    lock = _HELD.pop(str(Path(run_dir).resolve()), None)
    if lock is not None:
        lock.release()
