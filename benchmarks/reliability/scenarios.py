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
    into an empty database); the database put back, the rerun finishes exactly;
  - postgres_outage (--db postgres): PostgreSQL unreachable for 20 s mid-run: one line, exit 4; once it is
    back the same command finishes exactly;
  - mlflow_503: the MLflow server answering 503 for 20 s mid-run: ridden out, the run finishes exactly;
  - committed_window: SIGKILL the moment step 1's and then step 2's checkpoint is renamed into place
    (fault_injection's "committed" kill), rerun until done: nothing of those steps lost, pictures included;
  - disk_full: ENOSPC raised at step 1's checkpoint write (injected, as tests/flows/test_dependency_faults.py
    does): one line, exit 4; the same command then finishes exactly;
  - real_disk_full: the run folder on a real 1800 KiB tmpfs (root: `mount -t tmpfs`) that fills at step 2's
    checkpoint write: one line, exit 4, step 1's checkpoint intact; remounted larger, the same command
    finishes exactly;
  - mlflow_killed: a real `mlflow server` SIGKILLed once step 1 is checkpointed: one line, exit 4; the server
    restarted on the same port and store, the same command finishes exactly.
Writes benchmarks/results/fault_scenarios_<db>.json (`--tag T`: fault_scenarios_<db>_T.json).
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
from benchmarks.reliability.proxies import FailingHttpProxy, TcpProxy, free_port, wait_for_http  # noqa: E402


def _start(cmd: list[str], env: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def _refusal(proc: subprocess.Popen, log: Path, expect: str, rc: int = 2) -> dict:
    """A refused start (or a run ended by a failed service: rc 4): exit `rc`, one `error:` line containing
    `expect`, no traceback."""
    proc.wait()
    text = log.read_text()
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    ok = proc.returncode == rc and len(errors) == 1 and expect in errors[0] and "Traceback" not in text
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


def postgres_outage(work: Path, env: dict, steps: int, ref: dict, backend: str) -> dict:
    """PostgreSQL (through a TCP proxy) gone for 20 s once step 1 is checkpointed: the run ends in one line,
    exit 4 (its lock lives on the cut connection); once the database is back the same command finishes."""
    if backend != "postgres":
        return {"skipped": "a PostgreSQL outage: --db postgres only", "exact": None, "refusals": []}
    db = fi.db_for(backend, work)
    proxy = TcpProxy()
    try:
        cmd = fi.train_command(work, db.replace(":5432/", f":{proxy.port}/"), steps)
        first = _start(cmd, env, work / "outage.log")
        _wait_for(work / "runs" / "fi" / "checkpoints" / "step_000001", first)
        back = proxy.outage(20)
        ended = _refusal(first, work / "outage.log", "the experience database at", rc=4)
        back.join()
        out = _finish(_start(cmd, env, work / "resumed.log"), work, db, ref, [ended])
    finally:
        proxy.stop()
    return {**out, "outage_s": 20}


def mlflow_503(work: Path, env: dict, steps: int, ref: dict, backend: str) -> dict:
    """An MLflow server (a real `mlflow server` on work/mlflow.db) behind a proxy answering 503 for 20 s once
    step 1 is checkpointed: MLflow's client retries (flows/tracking.SERVER_RETRIES) and the run finishes."""
    db = fi.db_for(backend, work)
    port = free_port()
    server = _start([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                     "--workers", "1", "--backend-store-uri", f"sqlite:///{work / 'mlflow.db'}",
                     "--default-artifact-root", str(work / "mlartifacts")], env, work / "mlflow-server.log")
    proxy = None
    try:
        wait_for_http(f"http://127.0.0.1:{port}/health", server)
        proxy = FailingHttpProxy(f"http://127.0.0.1:{port}")
        run = _start(fi.train_command(work, db, steps, mlflow_uri=proxy.url), env, work / "run.log")
        _wait_for(work / "runs" / "fi" / "checkpoints" / "step_000001", run)
        proxy.fail_for(20)
        out = _finish(run, work, db, ref, [])
        return {**out, "answered_503": proxy.answered_503, "failing_s": 20,
                "log_tail": "" if out["winner_rc"] == 0 else (work / "run.log").read_text()[-600:]}
    finally:
        if proxy:
            proxy.close()
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def _plots(root: Path) -> set[str]:
    """The pictures' step folders (`plots/step_N`) in root/mlflow.db's runs."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return {Path(a.path).name for r in runs for a in client.list_artifacts(r.info.run_id, "plots")}


def committed_window(work: Path, env: dict, steps: int, ref: dict, backend: str) -> dict:
    """Killed right after step 1's and step 2's checkpoints are committed: whatever belongs to a step (metrics,
    monitors, perf/checkpoint_s, pictures) is recorded before its checkpoint, so the resumes lose nothing."""
    db = fi.db_for(backend, work)
    run = fi.run_until_done(fi.train_command(work, db, steps), env, work, [("committed", 1), ("committed", 2)])
    out = fi.compare(ref, fi.final_state(work, db)) if run["finished"] else {"exact": False}
    missing = sorted(_plots(work.parent / "reference") - _plots(work))  # the reference run's, in work's parent
    return {**out, "winner_rc": 0 if run["finished"] else run["failures"], "refusals": [], "leaked": run["leaked"],
            "kills": run["kills"], "attempts": run["attempts"], "plots_missing": missing,
            "exact": out["exact"] and not missing}


FULL_DISK = """import errno, sys
from exgrpo_core.run import checkpoint
real = checkpoint.save_checkpoint
def full(run_dir, step, *a, **k):
    if step >= {step}:
        raise OSError(errno.ENOSPC, "No space left on device", str(run_dir / "checkpoints" / f".tmp_step_{{step + 1:06d}}"))
    return real(run_dir, step, *a, **k)
checkpoint.save_checkpoint = full
from flows import cli
sys.exit(cli.main(sys.argv[1:]))
"""


def disk_full(work: Path, env: dict, steps: int, ref: dict, backend: str) -> dict:
    """`exgrpo train` with ENOSPC raised from step 1's checkpoint write on (the first checkpoint is written):
    exit 4, one line naming the full disk; then the same command, with space, finishes exactly."""
    db = fi.db_for(backend, work)
    cmd = fi.train_command(work, db, steps)
    full = [sys.executable, "-c", FULL_DISK.format(step=1), *cmd[3:]]  # cmd: python -m flows.cli train ...
    proc = _start(full, env, work / "full.log")
    ended = _refusal(proc, work / "full.log", "is full", rc=4)
    ended["leaked"] = fi.leaked_after_kill(proc.pid, within_s=10)
    out = _finish(_start(cmd, env, work / "resumed.log"), work, db, ref, [ended])
    out["leaked"] += ended["leaked"]
    ckpt = work / "runs" / "fi" / "checkpoints"
    return {**out, "checkpoints_after": sorted(p.name for p in ckpt.iterdir()) if ckpt.is_dir() else []}


def real_disk_full(work: Path, env: dict, steps: int, ref: dict, backend: str) -> dict:
    """The run folder on a real 1800 KiB tmpfs (`mount -t tmpfs`, as root): step 1's checkpoint fits, step
    2's fills the disk (ENOSPC arrives as torch's zip writer's RuntimeError): exit 4, one line naming the
    folder, the space free and needed, step 1's checkpoint intact; remounted at 64 MiB, the same command
    finishes exactly."""
    db = fi.db_for(backend, work)
    runs = work / "runs"
    runs.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1800k", "tmpfs", str(runs)], check=True)
    try:
        cmd = fi.train_command(work, db, steps)
        proc = _start(cmd, env, work / "full.log")
        ended = _refusal(proc, work / "full.log", "/runs/fi/checkpoints is full (", rc=4)
        ended["leaked"] = fi.leaked_after_kill(proc.pid, within_s=10)
        ckpt = runs / "fi" / "checkpoints"
        before = sorted(p.name for p in ckpt.iterdir()) if ckpt.is_dir() else []
        subprocess.run(["mount", "-o", "remount,size=64m", str(runs)], check=True)
        out = _finish(_start(cmd, env, work / "resumed.log"), work, db, ref, [ended])
        out["leaked"] += ended["leaked"]
        return {**out, "checkpoints_after_full": before}
    finally:
        subprocess.run(["umount", "-l", str(runs)], check=False)


def _mlflow_server(work: Path, env: dict, port: int, log: str) -> subprocess.Popen:
    server = _start([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                     "--workers", "1", "--backend-store-uri", f"sqlite:///{work / 'mlflow.db'}",
                     "--default-artifact-root", str(work / "mlartifacts")], env, work / log)
    wait_for_http(f"http://127.0.0.1:{port}/health", server)
    return server


def mlflow_killed(work: Path, env: dict, steps: int, ref: dict, backend: str) -> dict:
    """A real `mlflow server` (store work/mlflow.db) SIGKILLed once step 1 is checkpointed. The first run has
    MLflow's client retries off and a 5 s timeout (as the test does; the default ~2 min of retries would end
    in the same line): exit 4, one line naming the server. Restarted on the same port, the same command
    (default retries) finishes exactly."""
    db = fi.db_for(backend, work)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = fi.train_command(work, db, steps, mlflow_uri=url)
    server = _mlflow_server(work, env, port, "mlflow-server.log")
    try:
        quick = {**env, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
        first = _start(cmd, quick, work / "killed.log")
        _wait_for(work / "runs" / "fi" / "checkpoints" / "step_000001", first)
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        ended = _refusal(first, work / "killed.log", f"the MLflow server at {url} stopped answering", rc=4)
        ended["leaked"] = fi.leaked_after_kill(first.pid, within_s=10)
        server = _mlflow_server(work, env, port, "mlflow-server-2.log")
        out = _finish(_start(cmd, env, work / "resumed.log"), work, db, ref, [ended])
        out["leaked"] += ended["leaked"]
        return out
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


SCENARIOS = {"two_folders_one_db": two_folders_one_db, "mixed_backends": mixed_backends,
             "fresh_starts_together": fresh_starts_together, "moved_database": moved_database,
             "postgres_outage": postgres_outage, "mlflow_503": mlflow_503,
             "committed_window": committed_window, "disk_full": disk_full, "mlflow_killed": mlflow_killed,
             "real_disk_full": real_disk_full}


def main() -> int:
    from benchmarks.bench_record import save_result

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    ap.add_argument("--only", nargs="*", default=None, help="scenario names (default: all that apply)")
    ap.add_argument("--work", default=None)
    ap.add_argument("--tag", default="", help="results file fault_scenarios_<db>_<tag>.json (keeps the others)")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="fault-scenarios-"))
    env, _, ref = fi.reference_run(work, args.steps, args.db)
    names = args.only or [n for n in SCENARIOS if not (n in ("mixed_backends", "postgres_outage") and args.db == "sqlite")]
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
        save_result(f"fault_scenarios_{args.db}{'_' + args.tag if args.tag else ''}.json", {"db": args.db, "steps": args.steps, "scenarios": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
