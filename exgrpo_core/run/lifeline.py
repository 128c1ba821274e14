"""Child processes that die with their parent (issue 16, item 6).

A SIGKILL of the trainer runs no clean-up code, so each child has to notice on its own that its parent
is gone. Two means, used together:

- a daemon thread polling `os.getppid()`: when the parent dies the child is re-parented (to init or a
  sub-reaper), so the value changes; any POSIX system, a delay of at most `poll_s`;
- Linux's PR_SET_PDEATHSIG: the kernel SIGKILLs the child the moment its parent *thread* ends, even
  while Python is stuck in C code holding the GIL. Only for a child started from a thread that lives
  as long as its process (a main thread, multiprocessing's forkserver loop): otherwise the child would
  die when that thread ends.

The verifier's workers fork from multiprocessing's forkserver, which would outlive the trainer (the
workers hold its keep-alive pipe): `FORKSERVER_PRELOAD` is preloaded into the forkserver, which then
watches the trainer, and gives every process it forks PR_SET_PDEATHSIG tied to itself
(`exgrpo_core.reward.grading`). `flows.prefect_api` starts Prefect's API the same way.
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import sys
import threading
import time

FORKSERVER_PRELOAD = "exgrpo_core.run._forkserver_lifeline"
"""Module to pass to multiprocessing's set_forkserver_preload (imported only in the forkserver)."""
_PR_SET_PDEATHSIG = 1


def kill_on_parent_death(parent: int | None = None) -> bool:
    """Linux: ask the kernel to SIGKILL this process when the thread that started it ends; then, when
    `parent` (the pid expected as parent) is already gone, die now. False where not supported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        ok = ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
    if ok and parent is not None and os.getppid() != parent:  # it died before the prctl took effect
        _die()
    return ok


def die_with_parent(parent: int | None = None, *, kernel: bool = False, poll_s: float = 0.2) -> None:
    """End this process (SIGKILL) when its parent process ends.

    Args:
        parent: the pid the caller knows to be its parent (default: the current parent); when it is no
            longer the parent, the process dies at once.
        kernel: also `kill_on_parent_death` (only when started from a long-lived thread, see above).
        poll_s: how often the watchdog thread reads os.getppid().
    """
    parent = os.getppid() if parent is None else parent
    if kernel:
        kill_on_parent_death(parent)
    if os.getppid() != parent:
        _die()
    threading.Thread(target=_watch, args=(parent, poll_s), name="exgrpo-lifeline", daemon=True).start()


def _watch(parent: int, poll_s: float) -> None:
    while os.getppid() == parent:
        time.sleep(poll_s)
    _die()


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


_PR_GET_PDEATHSIG = 2
_spawner: "queue.Queue | None" = None
_spawner_lock = threading.Lock()


def start_tied(proc) -> None:
    """Start `proc` (a multiprocessing Process) from a thread that lives as long as this process: the main
    thread, or a daemon thread kept for it, so that a child calling `die_with_parent(kernel=True)` gets
    PR_SET_PDEATHSIG tied to this process's life, not to a short-lived caller thread (a Prefect task's)."""
    global _spawner
    if threading.current_thread() is threading.main_thread():
        proc.start()
        return
    with _spawner_lock:
        if _spawner is None:
            _spawner = queue.Queue()
            threading.Thread(target=_spawn_loop, args=(_spawner,), name="exgrpo-spawner", daemon=True).start()
    done: dict = {"event": threading.Event(), "error": None}
    _spawner.put((proc, done))
    done["event"].wait()
    if done["error"] is not None:
        raise done["error"]


def _spawn_loop(jobs) -> None:
    while True:
        proc, done = jobs.get()
        try:
            proc.start()
        except BaseException as e:  # handed to the caller
            done["error"] = e
        done["event"].set()


def pdeathsig() -> int:
    """Linux: the signal this process gets when its parent thread ends (0: none, or not Linux)."""
    if not sys.platform.startswith("linux"):
        return 0
    sig = ctypes.c_int(0)
    ctypes.CDLL(None, use_errno=True).prctl(_PR_GET_PDEATHSIG, ctypes.byref(sig), 0, 0, 0)
    return sig.value
