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
