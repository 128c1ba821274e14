"""A write that failed because its file system is full, however the error arrived.

ENOSPC reaches a checkpoint write in several disguises: an OSError (errno 28) from Python's own writes,
a RuntimeError from torch's zip writer ("PytorchStreamWriter failed writing file", "basic_ios::clear:
iostream error", "unexpected pos"), safetensors' own error type. `as_disk_full` tells them apart from
other failures by the file system itself (`is_disk_full`: free space left under the folder); `disk_full`
is the one `DiskFullError` naming the folder, the space free and the space needed.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

NEARLY_FULL = 16 << 20  # bytes free below which a failed write is taken for a full disk


class DiskFullError(OSError):
    """No space left under `filename` (a folder); `detail` says how much is free and needed."""

    detail = ""


def human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def free_bytes(path: str | Path) -> int | None:
    """Bytes an unprivileged writer may still use on the file system of `path` (its nearest existing folder)."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def folder_bytes(path: str | Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def exception_chain(exc: BaseException | None):
    """`exc`, then its causes and contexts, each once."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def is_disk_full(err: BaseException, folder: str | Path) -> bool:
    """Whether `err` is a write failing for lack of space under `folder`: an ENOSPC / EDQUOT OSError in its
    chain, or a writer's error (OSError, RuntimeError, safetensors') while less than NEARLY_FULL is free."""
    if isinstance(err, DiskFullError):
        return True
    if any(isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT) for e in exception_chain(err)):
        return True
    writer = isinstance(err, (OSError, RuntimeError)) or type(err).__module__.startswith("safetensors")
    free = free_bytes(folder)
    return writer and free is not None and free < NEARLY_FULL


def disk_full(folder: str | Path, needed: int | None, what: str = "the write",
              filename: str | Path | None = None) -> DiskFullError:
    """The DiskFullError for `folder` now: the space free there and what `what` needs."""
    free = free_bytes(folder)
    detail = ", ".join(x for x in (f"{human(free)} free" if free is not None else "",
                                   f"{what} needs about {human(needed)}" if needed else "") if x)
    full = DiskFullError(errno.ENOSPC, f"No space left on device ({detail})" if detail else
                         "No space left on device", str(filename or folder))
    full.detail = detail
    return full
