"""Children die with their parent (issue 16, item 6): SIGKILL of a process holding a MathVerifier whose
workers are busy leaves nothing behind (forkserver, workers, resource tracker)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from exgrpo_core.run import lifeline

HOLDER = textwrap.dedent("""
    from exgrpo_core.reward.grading import MathVerifier
    if __name__ == "__main__":
        import threading, time
        v = MathVerifier(timeout_s=600, workers=2)
        v.verify(["\\\\boxed{1}"] * 2, ["1"] * 2)
        print(" ".join(str(w.proc.pid) for w in v._workers), flush=True)
        threading.Thread(target=v.verify, args=(["_test_sleep(300)"] * 2, ["1"] * 2), daemon=True).start()
        time.sleep(600)  # killed here while both workers are busy grading
""")


def survivors(procs: list[psutil.Process], within_s: float = 60.0) -> list[psutil.Process]:
    """The processes still alive (zombies count as dead) after polling up to `within_s`."""
    deadline = time.monotonic() + within_s
    while True:
        alive = [p for p in procs if _alive(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def reap(leaked: list[psutil.Process]) -> list[str]:
    """Kill what leaked (leave nothing behind whatever the outcome); their command lines, for the message."""
    out = []
    for p in leaked:
        try:
            out.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
            p.kill()
        except psutil.Error:
            pass
    return out


def test_verifier_processes_die_when_their_owner_is_killed(tmp_path):
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path),
                                 "EXGRPO_VERIFY_TEST_HOOKS": "1"})
    try:
        workers = [int(p) for p in proc.stdout.readline().split()]
        time.sleep(1)  # both workers are now in their 300 s item
        tree = psutil.Process(proc.pid).children(recursive=True)
        assert set(workers) <= {p.pid for p in tree} and len(tree) >= 4  # + forkserver, resource tracker
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        leaked = survivors(tree)
    finally:
        proc.kill()
    assert not (leaked := reap(leaked)), f"outlived their parent: {leaked}"


def test_die_with_parent_ends_a_child_whose_parent_is_killed(tmp_path):
    """The watchdog alone (no PR_SET_PDEATHSIG): a grandchild whose parent is SIGKILLed dies."""
    code = textwrap.dedent("""
        import os, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "from exgrpo_core.run import lifeline; import time; "
                                  "lifeline.die_with_parent(poll_s=0.05); print('armed', flush=True); "
                                  "time.sleep(600)"], stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "armed"
        print(child.pid, flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    child = psutil.Process(int(proc.stdout.readline()))
    proc.kill()
    proc.wait()
    assert not (leaked := reap(survivors([child]))), leaked


def test_the_forkserver_module_arms_nothing_outside_a_forkserver():
    """Importing the preload module in an ordinary process starts no watchdog (it would tie the trainer to
    its shell)."""
    import exgrpo_core.run._forkserver_lifeline  # noqa: F401

    import threading

    assert "exgrpo-lifeline" not in {t.name for t in threading.enumerate()}
    assert lifeline.FORKSERVER_PRELOAD == "exgrpo_core.run._forkserver_lifeline"


def _report_pdeathsig(q) -> None:
    lifeline.die_with_parent(kernel=True)
    q.put(lifeline.pdeathsig())
    time.sleep(60)


@pytest.mark.parametrize("start", ["tied", "plain"])
def test_a_child_started_from_a_short_lived_thread_outlives_that_thread_only_when_tied(start):
    """PR_SET_PDEATHSIG fires when the *thread* that started the child ends: `start_tied` starts it from one
    that lives as long as the process (Prefect runs the training in a task's thread)."""
    import multiprocessing as mp
    import threading

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=_report_pdeathsig, args=(q,), daemon=True)
    armed = []

    def starter():
        lifeline.start_tied(proc) if start == "tied" else proc.start()
        armed.append(q.get(timeout=120))  # the child armed its kernel lifeline while this thread lived

    t = threading.Thread(target=starter)
    t.start()
    t.join()
    try:
        assert armed == [signal.SIGKILL]
        for _ in range(30):  # the kernel's SIGKILL, if any, lands at once; give it 3 s
            if not proc.is_alive():
                break
            time.sleep(0.1)
        assert proc.is_alive() == (start == "tied")
    finally:
        proc.kill()
        proc.join()
