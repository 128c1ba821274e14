"""Inter-process locks: a blocking file lock for one-time creation, and the one-process-per-run lock.

Both are kernel locks (`flock` on a file, a PostgreSQL session advisory lock), so they are released
when the holding process dies, however it dies: a killed run never leaves a stale lock behind.
`RunLock` refuses a second holder at once, with one line naming the first (pid, host, since when).
`lock_run` locks both things a run lives in: its folder (checkpoints) and the run in its database
(an advisory lock in that PostgreSQL database, or file locks beside the SQLite file and on its inode),
so neither two folders sharing one database, nor one folder with two databases, nor two hard-linked
names of one SQLite file gives a run two writers.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import socket
import stat
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


def check_run_name(name: str) -> None:
    """A run name is one folder name under run.output_dir: ConfigError (one line) for an empty name, `.`,
    `..`, a path separator, a control character or more than 200 characters."""
    from exgrpo_core.config.base import ConfigError

    bad = (not name or name in (".", "..") or "/" in name or "\\" in name or len(name) > 200
           or any(ord(c) < 32 or ord(c) == 127 for c in name))
    if bad:
        raise ConfigError(f"run.name {name[:80]!r} is not a folder name: use letters, digits, '-', '_' or '.' "
                          "(no '/', '..' or control characters, at most 200 characters)")


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
    def file(cls, run_dir: str | Path, name: str, path: str | Path | None = None, where: str = "") -> "RunLock":
        """An `flock` on `path` (default `run_dir/.lock`); `where` is added to the holder's label."""
        path = Path(path) if path is not None else Path(run_dir) / ".lock"
        while True:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
                os.close(fd)
                raise RunLockedError(f"run '{name}' is already running ({holder}; lock {path}): wait for it to "
                                     "end, stop it, or set run.name to start another run") from None
            try:  # the file may have been removed (a failed start cleaning up) while we waited: lock the new one
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, (holder_label() + where).encode(), 0)
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
            try:  # a dead server or connection has freed the lock already: never raise over the real error
                conn.execute(text("select pg_advisory_unlock(:k)"), {"k": key})
                conn.commit()
            except Exception:  # noqa: BLE001
                conn.invalidate()
            finally:
                conn.close()
        return cls(release)


_HELD: dict[str, RunLock] = {}
_PINNED: dict[str, RunLock] = {}
_UMASK: list[int] = []  # the umask before this process took its first run lock  # run folder -> the lock on its SQLite file's inode
_CREATED: set[str] = set()
LOCK_SUFFIX = ".runlock"


def database_lock_path(db_url: str, name: str) -> Path | None:
    """The file locking run `name` in an SQLite database: `<database file>.<hash of name>.runlock` beside
    it; None for an in-memory database (no other process can reach it)."""
    from sqlalchemy.engine import make_url

    database = make_url(db_url).database
    if database in (None, "", ":memory:"):
        return None
    db = Path(database).expanduser().resolve()
    return db.with_name(f"{db.name}.{hashlib.sha256(name.encode()).hexdigest()[:12]}{LOCK_SUFFIX}")


INODE_LOCK_DIR = "/tmp/exgrpo-runlocks-{uid}"  # one per user and machine, whatever TMPDIR says


def inode_lock_path(db_url: str, name: str) -> Path | None:
    """A lock file for run `name` keyed on the SQLite file itself, (st_dev, st_ino), in this machine's
    INODE_LOCK_DIR: every hard-linked name of one database meets the same lock. None for an in-memory
    database or a file that does not exist yet (no other name of it exists either)."""
    from sqlalchemy.engine import make_url

    database = make_url(db_url).database
    if database in (None, "", ":memory:"):
        return None
    try:
        st = os.stat(Path(database).expanduser())
    except (FileNotFoundError, NotADirectoryError):
        return None
    folder = Path(os.environ.get("EXGRPO_RUNLOCK_DIR") or INODE_LOCK_DIR.format(uid=os.getuid()))
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    owner = os.lstat(folder)
    if not stat.S_ISDIR(owner.st_mode) or owner.st_uid != os.getuid():
        raise RunLockedError(f"lock folder {folder} is not a folder of this user: remove it or set EXGRPO_RUNLOCK_DIR")
    return folder / f"{st.st_dev}-{st.st_ino}.{hashlib.sha256(name.encode()).hexdigest()[:12]}{LOCK_SUFFIX}"


def _database_lock(run_dir: Path, name: str, db_url: str) -> RunLock | None:
    """The lock on run `name` in the database of `db_url`: an advisory lock in that PostgreSQL database
    (advisory locks are per database), else a file lock beside the SQLite file."""
    where = f" in {run_dir}"
    if db_url.startswith("postgres"):
        from exgrpo_core.store.engine import create_store_engine, parse_url

        engine = create_store_engine(parse_url(db_url))
        try:
            lock = RunLock.postgres(engine, name)
        except BaseException:
            engine.dispose()
            raise
        inner = lock._release
        lock._release = lambda: (inner(), engine.dispose())
        return lock
    path = database_lock_path(db_url, name)
    return RunLock.file(run_dir, name, path, where) if path else None


def lock_run(run_dir: str | Path, name: str, db_url: str) -> RunLock:
    """This process's lock on the run in `run_dir` (taken once; idempotent): a file lock `run_dir/.lock` on
    the folder, and the lock on the run's name in its database (`_database_lock`). Either one held by
    another process refuses this one with one line naming the holder."""
    check_run_name(name)
    run_dir = Path(run_dir).resolve()
    key = str(run_dir)
    if key not in _HELD:
        private_dir(run_dir)
        folder = RunLock.file(run_dir, name)
        try:
            db = _database_lock(run_dir, name, db_url)
        except BaseException:
            folder.release()
            raise

        def release() -> None:
            try:
                pinned = _PINNED.pop(key, None)
                if pinned is not None:
                    pinned.release()
                if db is not None:
                    db.release()
            finally:
                folder.release()
        if not _HELD:  # while this process holds a run, what it creates is its user's only (umask 077)
            _UMASK.append(os.umask(0o077))
        _HELD[key] = RunLock(release)
        try:
            pin_database(run_dir, name, db_url)
        except BaseException:
            unlock_run(run_dir)
            raise
    return _HELD[key]


def pin_database(run_dir: str | Path, name: str, db_url: str) -> None:
    """Add the lock on the SQLite file's inode (`inode_lock_path`) to this process's lock on the run, once
    the file exists: `lock_run` takes it when the file is there, the session again after creating it."""
    key = str(Path(run_dir).resolve())
    if key not in _HELD or key in _PINNED or db_url.startswith("postgres"):
        return
    path = inode_lock_path(db_url, name)
    if path is not None:
        _PINNED[key] = RunLock.file(run_dir, name, path, f" in {key}")


def private_dir(path: Path) -> None:
    """Create folder `path` (and its parents) mode 0700, and make an existing one of this user 0700: a run
    folder holds checkpoints, its database and its config, readable by no other local user."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.mkdir(mode=0o700, exist_ok=True)
    if path.stat().st_uid == os.getuid() and path.stat().st_mode & 0o077:
        os.chmod(path, 0o700)


def make_run_dir(run_dir: str | Path) -> None:
    """Create `run_dir` (and its parents; `private_dir`), remembering whether this process created it."""
    run_dir = Path(run_dir).resolve()
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    try:
        run_dir.mkdir(mode=0o700)  # only one of two processes at the same moment makes it
        _CREATED.add(str(run_dir))
    except FileExistsError:
        pass
    private_dir(run_dir)


def remove_failed_start(run_dir: str | Path) -> bool:
    """After a failed start: remove `run_dir` when this process created it, it holds nothing but lock
    files, and no other process holds its lock (checked by taking the lock; removed while holding it).
    A folder another process made or locked, even at the same moment, is left alone."""
    run_dir = Path(run_dir).resolve()
    if str(run_dir) not in _CREATED or not run_dir.is_dir():
        return False
    unlock_run(run_dir)
    try:
        lock = RunLock.file(run_dir, run_dir.name)
    except RunLockedError:
        return False
    try:
        if not all(p.name == ".lock" or p.name.endswith(LOCK_SUFFIX) for p in run_dir.iterdir()):
            return False
        shutil.rmtree(run_dir, ignore_errors=True)
        _CREATED.discard(str(run_dir))
        return True
    finally:
        lock.release()


def holds(run_dir: str | Path) -> bool:
    """Whether this process holds the lock on the run in `run_dir`."""
    return str(Path(run_dir).resolve()) in _HELD


def unlock_run(run_dir: str | Path) -> None:
    """Release this process's lock on the run in `run_dir`, if it holds one."""
    lock = _HELD.pop(str(Path(run_dir).resolve()), None)
    if lock is not None:
        lock.release()
        if not _HELD and _UMASK:
            os.umask(_UMASK.pop())
