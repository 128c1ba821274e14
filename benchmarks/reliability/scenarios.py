"""Targeted faults of issue 35 on a tiny `exgrpo train`, next to fault_injection.py's random kills:
the run lock's bypasses and a lost experience database. Each scenario ends with the finished run's state
compared with an uninterrupted run's (fault_injection.compare), and every refused start checked for one
early line (exit 2, no traceback).

    nice -n 19 python benchmarks/reliability/scenarios.py --steps 4 [--db sqlite|postgres]

Scenarios:
  - two_folders_one_db: a second `exgrpo train` of the live run in another output folder, same database;
  - mixed_backends (--db postgres): a second one in the same folder on the default SQLite file;
  - fresh_starts_together: two starts of a new run launched at the same moment (one must win, intact);
  - moved_database: killed after a checkpoint, the database moved away: the rerun must refuse (not resume
    into an empty database); the database put back, the rerun finishes exactly.
Writes benchmarks/results/fault_scenarios_<db>.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from benchmarks.reliability import fault_injection as fi  # noqa: E402


def _start(cmd: list[str], env: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def _refusal(proc: subprocess.Popen, log: Path, expect: str) -> dict:
    """A refused start: exit 2, one `error:` line containing `expect`, no traceback."""
    proc.wait()
    text = log.read_text()
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    ok = proc.returncode == 2 and len(errors) == 1 and expect in errors[0] and "Traceback" not in text
    return {"rc": proc.returncode, "one_line": ok, "line": (errors or [text[-300:]])[0][:300]}


def _wait_for(path: Path, proc: subprocess.Popen, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{path} never appeared (rc {proc.poll()})")
        time.sleep(0.05)


def _while_paused(first: subprocess.Popen, cmd: list[str], env: dict, log: Path) -> dict:
    """Start `cmd` while the live run `first` is stopped (SIGSTOP: it keeps its locks, and cannot finish
    before the second one has started), check its refusal, then let `first` go on."""
    os.kill(first.pid, signal.SIGSTOP)
    try:
        return _refusal(_start(cmd, env, log), log, "run 'fi' is already running")
    finally:
        os.kill(first.pid, signal.SIGCONT)


def _finish(proc: subprocess.Popen, root: Path, db: str, ref: dict, refusals: list[dict]) -> dict:
    proc.wait()
    leaked = fi.leaked_after_kill(proc.pid, within_s=10)
    diff = fi.compare(ref, fi.final_state(root, db)) if proc.returncode == 0 else {"exact": False}
    return {"winner_rc": proc.returncode, "refusals": refusals, "leaked": leaked,
            "refused_in_one_line": sum(r["one_line"] for r in refusals), **diff}


def two_folders_one_db(work: Path, env: dict, steps: int, ref: dict, backend: str) -> dict:
    a, b = work / "a", work / "b"
    a.mkdir(), b.mkdir()
    db = fi.db_for(backend, a)
    first = _start(fi.train_command(a, db, steps), env, a / "first.log")
    _wait_for(a / "runs" / "fi" / "checkpoints" / "step_000001", first)
    refusal = _while_paused(first, fi.train_command(b, db, steps), env, b / "second.log")
    return _finish(first, a, db, ref, [refusal])


def mixed_backends(work: Path, env: dict, steps: int, ref: dict, backend: str) -> dict:
    db = fi.db_for(backend, work)
    first = _start(fi.train_command(work, db, steps), env, work / "first.log")
    _wait_for(work / "runs" / "fi" / "checkpoints" / "step_000001", first)
    other = "sqlite:///" + str(work / "runs" / "fi" / "experience.db") if backend == "postgres" else fi.PG.format("test")
    refusal = _while_paused(first, fi.train_command(work, other, steps), env, work / "second.log")
    return _finish(first, work, db, ref, [refusal])


def fresh_starts_together(work: Path, env: dict, steps: int, ref: dict, backend: str) -> dict:
    db = fi.db_for(backend, work)
    procs = [_start(fi.train_command(work, db, steps), env, work / f"start{i}.log") for i in range(2)]
    for p in procs:
        p.wait()
    winners = [i for i, p in enumerate(procs) if p.returncode == 0]
    refusals = [_refusal(p, work / f"start{i}.log", "run 'fi' is already running")
                for i, p in enumerate(procs) if i not in winners]
    if len(winners) != 1:
        return {"winner_rc": [p.returncode for p in procs], "refusals": refusals, "leaked": [],
                "refused_in_one_line": 0, "exact": False}
    return _finish(procs[winners[0]], work, db, ref, refusals)


def moved_database(work: Path, env: dict, steps: int, ref: dict, backend: str) -> dict:
    if backend != "sqlite":
        return {"skipped": "the database is moved as a file: SQLite only", "exact": None, "refusals": []}
    db = fi.db_for(backend, work)
    cmd = fi.train_command(work, db, steps)
    ckpt = work / "runs" / "fi" / "checkpoints"
    run = fi.run_until_done(cmd, env, work, [("checkpoint", 1)], max_attempts=1)  # killed, not rerun
    moved = work / "moved"
    moved.mkdir()
    for f in work.glob("exp.db*"):
        f.rename(moved / f.name)
    refusal = _refusal(_start(cmd, env, work / "refused.log"), work / "refused.log", "has no such run")
    for f in work.glob("exp.db*"):
        f.unlink()  # anything the refused start made (it must make nothing)
    for f in moved.iterdir():
        f.rename(work / f.name)  # the recovery the line names: the database the run trained with
    shutil.rmtree(moved)
    last = _start(cmd, env, work / "recovered.log")
    out = _finish(last, work, db, ref, [refusal])
    out["kills"] = run["kills"]
    out["checkpoints_before_move"] = sorted(p.name for p in ckpt.iterdir()) if ckpt.is_dir() else []
    return out


SCENARIOS = {"two_folders_one_db": two_folders_one_db, "mixed_backends": mixed_backends,
             "fresh_starts_together": fresh_starts_together, "moved_database": moved_database}


def main() -> int:
    from benchmarks.bench_record import save_result

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    ap.add_argument("--only", nargs="*", default=None, help="scenario names (default: all that apply)")
    ap.add_argument("--work", default=None)
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="fault-scenarios-"))
    env = fi.environment(work / "prefect")
    ref_root = work / "reference"
    ref_root.mkdir(parents=True)
    ref_db = fi.db_for(args.db, ref_root)
    ref_run = fi.run_until_done(fi.train_command(ref_root, ref_db, args.steps), env, ref_root, [])
    assert ref_run["finished"], ref_run["failures"]
    ref = fi.final_state(ref_root, ref_db)
    names = args.only or [n for n in SCENARIOS if not (n == "mixed_backends" and args.db == "sqlite")]
    results = {}
    for name in names:
        root = work / name
        root.mkdir()
        t0 = time.monotonic()
        results[name] = {**SCENARIOS[name](root, env, args.steps, ref, args.db), "seconds": round(time.monotonic() - t0, 1)}
        r = results[name]
        print(f"{name}: exact={r.get('exact')} refused in one line {r.get('refused_in_one_line')}/{len(r['refusals'])} "
              f"lost/extra {r.get('rows_lost')}/{r.get('rows_extra')} dup {r.get('duplicate_points')} "
              f"orphaned {r.get('orphaned_runs')} leaked {len(r.get('leaked', []))}", flush=True)
        save_result(f"fault_scenarios_{args.db}.json", {"db": args.db, "steps": args.steps, "scenarios": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
