"""Fault injection: SIGKILL a tiny `exgrpo train` at random moments, rerun the same command until it
finishes, and compare the end state with an uninterrupted run of the same command.

    nice -n 19 python benchmarks/reliability/fault_injection.py --trials 20 --db sqlite
    nice -n 19 python benchmarks/reliability/fault_injection.py --trials 10 --db postgres   # 127.0.0.1:5432, user postgres
    nice -n 19 python benchmarks/reliability/fault_injection.py --trials 4 --steps 6 --overlap 1   # rollout.overlap=1
    nice -n 19 python benchmarks/reliability/fault_injection.py --trials 3 --steps 4 --overlap 1 --sampler process

Each run: the tiny preset, `run.checkpoint_every=1`, Prefect's ephemeral API (PREFECT_API_URL unset),
local MLflow (SQLite), the experience database on SQLite or a fresh PostgreSQL database. Kills are
SIGKILL to the `exgrpo train` process only (never its process group), of four kinds:
  - time: a uniformly random moment in the first 90% of an uninterrupted run's duration (start-up,
    Prefect, model load, any stage of a step);
  - checkpoint: the moment a checkpoint write of a random step has begun (`.tmp_step_N` exists);
  - committed: the moment a step's checkpoint has been renamed into place (`step_N` exists): whatever
    belongs to that step (metrics, monitors, pictures, perf/checkpoint_s) must already be recorded;
  - in_flight (`--overlap 1`, a third of the kills): the moment a random step's checkpoint begins to wait for
    the batch sampled ahead; such a trial runs through slow_sampler.py, whose sampler sleeps SLOW_SAMPLER_S
    before each batch, so the batch is still being sampled then (`batch_in_flight` says it was); with
    `--sampler process` (rollout.overlap_sampler=process) the trainer's thread receiving the child's batch
    holds it instead, so the batch is not yet received then (the child may have finished sampling it).
After each kill, every process of the killed command's session must be gone within 30 s (else it is
counted as leaked, and killed): the process sampler's child (multiprocessing spawn) is in that session. Per trial, the final state against the reference run:
  - weights: SHA-256 over the final checkpoint's tensors (and over the optimiser's);
  - rows: every row of every experience table, ids replaced by their insertion rank, timestamps,
    run ids and paths left out; lost = in the reference only, extra = in the trial only;
  - MLflow: duplicate points (more than one per metric and step), (metric, step) pairs missing or extra;
  - orphaned runs: database runs of the name other than one `finished`, MLflow runs not FINISHED, any MLflow
    run beyond one (a resume continues the same MLflow run).
Writes benchmarks/results/fault_injection_<db>.json (`..._overlap1.json` with --overlap 1,
`..._overlap1_process.json` with --sampler process as well). Targeted faults
(the run lock's bypasses, a moved database) are benchmarks/reliability/scenarios.py.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
PG = "postgresql+psycopg://postgres@127.0.0.1:5432/{}"
TABLES = ("questions", "question_states", "group_results", "trajectories", "replays", "step_metrics",
          "pool_slot_log", "eval_results", "runs")
SKIP_COLUMNS = {"run_id", "created_at", "updated_at", "config_json", "mlflow_run_id"}
RANKED = {"trajectory_id": "trajectories", "question_id": "questions"}


def train_command(root: Path, db_url: str, steps: int, name: str = "fi", mlflow_uri: str | None = None,
                  overlap: int = 0, slow_sampler_s: float = 0.0, sampler: str = "thread") -> list[str]:
    """`exgrpo train` of the tiny preset in root with `rollout.overlap` and `rollout.overlap_sampler`; MLflow: `mlflow_uri`, else the SQLite
    store root/mlflow.db. `slow_sampler_s` > 0 (overlap 1): through slow_sampler.py, whose sampler sleeps that
    long before each batch it samples ahead and which marks each checkpoint's wait for it (`in_flight` kills)."""
    mlflow_uri = mlflow_uri or f"sqlite:///{root / 'mlflow.db'}"
    sets = [f"run.output_dir={root / 'runs'}", f"run.db_url={db_url}", f"run.name={name}",
            f"run.mlflow_tracking_uri={mlflow_uri}", f"run.steps={steps}",
            "run.checkpoint_every=1", *([f"rollout.overlap={overlap}"] if overlap else []),
            *([f"rollout.overlap_sampler={sampler}"] if sampler != "thread" else [])]
    cli = ([str(Path(__file__).with_name("slow_sampler.py")), str(slow_sampler_s)] if slow_sampler_s
           else ["-m", "flows.cli"])
    return [sys.executable, *cli, "train", "--config", "tiny", *sum((["--set", s] for s in sets), [])]


def environment(prefect_home: Path) -> dict:
    """Prefect's ephemeral API (as a user without a server has), its files under prefect_home."""
    env = {**os.environ, "PREFECT_HOME": str(prefect_home), "PYTHONPATH": str(ROOT)}
    env.pop("PREFECT_API_URL", None)
    return env


def session_processes(sid: int) -> list[int]:
    """Live (non-zombie) processes of session `sid` (the killed command's own session)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z" and int(fields[3]) == sid:
                found.append(int(entry))
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:160]
    except OSError:
        return "?"


def leaked_after_kill(sid: int, within_s: float = 30.0) -> list[str]:
    """Processes of the killed command's session still alive after `within_s`; they are killed."""
    deadline = time.monotonic() + within_s
    while (alive := session_processes(sid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    leaked = [f"{p} {_cmdline(p)}" for p in alive]
    for p in alive:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    gone_by = time.monotonic() + 10.0  # a SIGKILLed process takes a moment to become a zombie under load
    while set(alive) & set(session_processes(sid)) and time.monotonic() < gone_by:
        time.sleep(0.05)
    return leaked


def _wait_kill(proc: subprocess.Popen, kill: tuple[str, float], ckpt: Path) -> dict | None:
    """Wait for the kill's moment and SIGKILL the process; None when it finished first."""
    kind, arg = kill
    start = time.monotonic()
    while proc.poll() is None:
        if kind == "time" and time.monotonic() - start >= arg:
            break
        if kind == "checkpoint" and ckpt.is_dir() and any(
                p.name.startswith(".tmp_step_") and int(p.name[10:]) > arg for p in ckpt.iterdir()):  # N = step + 1
            break
        if kind == "committed" and (ckpt / f"step_{int(arg) + 1:06d}").is_dir():
            break
        if kind == "in_flight" and (ckpt.parent / f"in_flight_{int(arg)}").is_file():  # slow_sampler.py's mark
            break
        time.sleep(0.05 if kind == "time" else 0.002)
    else:
        return None
    spawned = [p for p in session_processes(proc.pid) if "multiprocessing.spawn" in _cmdline(p)]  # sampler child
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    in_write = ckpt.is_dir() and any(p.name.startswith(".tmp_step_") for p in ckpt.iterdir())
    out = {"kind": kind, "at": arg, "after_s": round(time.monotonic() - start, 2), "in_checkpoint_write": in_write,
           "spawned_children": len(spawned)}
    if kind == "in_flight":  # the sampler thread was still running when the checkpoint began to wait for it
        mark = ckpt.parent / f"in_flight_{int(arg)}"
        out["batch_in_flight"] = mark.read_text() == "alive"
        mark.unlink()
    return out


def run_until_done(cmd: list[str], env: dict, root: Path, kills: list[tuple[str, float]],
                   max_attempts: int = 8) -> dict:
    """Start `cmd`; apply each kill in turn (rerunning after each), then rerun until it exits 0."""
    out = {"kills": [], "leaked": [], "attempts": 0, "finished": False, "failures": []}
    ckpt, pending = root / "runs" / "fi" / "checkpoints", list(kills)
    while out["attempts"] < max_attempts:
        out["attempts"] += 1
        log_path = root / f"attempt{out['attempts']}.log"
        for mark in ckpt.parent.glob("in_flight_*"):  # slow_sampler.py's marks of an earlier attempt
            mark.unlink()
        log = open(log_path, "w")
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        killed = _wait_kill(proc, pending.pop(0), ckpt) if pending else None
        if killed is not None:
            out["kills"].append(killed)
            t0 = time.monotonic()
            out["leaked"] += leaked_after_kill(proc.pid)
            killed["session_gone_s"] = round(time.monotonic() - t0, 2)  # 30 s or more: something was leaked
            log.close()
            continue
        proc.wait()
        log.close()
        out["leaked"] += leaked_after_kill(proc.pid, within_s=10)  # nothing may outlive a finished run either
        if proc.returncode == 0:
            out["finished"] = True
            break
        out["failures"].append(f"exit {proc.returncode}: {log_path.read_text()[-800:]}")
    return out


def _tensor_hash(tensors) -> str:
    import torch

    h = hashlib.sha256()
    for name, t in tensors:
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def weights(root: Path) -> dict:
    """SHA-256 of the final checkpoint's weights and optimiser tensors, and its step."""
    import torch
    from safetensors.torch import load_file

    from exgrpo_core.run.checkpoint import STATE_FILE, latest_checkpoint

    ck = latest_checkpoint(root / "runs" / "fi")
    if ck is None:
        return {"step": None, "weights": None, "optimizer": None}
    model = load_file(str(ck / "model.safetensors"))
    state = torch.load(ck / STATE_FILE, map_location="cpu", weights_only=False)
    opt = [(f"{k}.{n}", v) for k, s in sorted(state["optimizer"]["state"].items())
           for n, v in sorted(s.items()) if torch.is_tensor(v)]
    return {"step": state["step"], "weights": _tensor_hash(sorted(model.items())), "optimizer": _tensor_hash(opt)}


def rows(db_url: str) -> dict[str, Counter]:
    """Every table's rows as comparable tuples (ids as insertion ranks, volatile columns left out)."""
    import sqlalchemy as sa

    eng = sa.create_engine(db_url)
    try:
        with eng.connect() as c:
            raw = {t: c.execute(sa.text(f"select * from {t} order by 1")).mappings().all() for t in TABLES}
    finally:
        eng.dispose()
    rank = {t: {r["id"]: i for i, r in enumerate(sorted(raw[t], key=lambda r: r["id"]))}
            for t in ("trajectories", "questions")}
    out = {}
    for t, table_rows in raw.items():
        items = []
        for r in table_rows:
            row = []
            for k, v in sorted(r.items()):
                if k in SKIP_COLUMNS or (k == "id" and t not in rank):
                    continue
                v = rank[t][v] if k == "id" else rank[RANKED[k]].get(v, v) if k in RANKED else v
                row.append((k, bytes(v) if isinstance(v, memoryview) else v))
            if t == "step_metrics" and str(r["key"]).startswith("perf/"):
                row = [(k, v) for k, v in row if k != "value"]  # timings differ from run to run
            items.append(tuple(row))
        out[t] = Counter(items)
    return out


def mlflow_points(root: Path, db_url: str) -> dict:
    """(metric, step) -> number of points of the run's MLflow run, and MLflow runs not FINISHED."""
    import mlflow
    import sqlalchemy as sa

    eng = sa.create_engine(db_url)
    with eng.connect() as c:
        ids = [r[0] for r in c.execute(sa.text("select mlflow_run_id from runs where name='fi'"))]
    eng.dispose()
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    points: Counter = Counter()
    for run_id in filter(None, ids):
        for key in client.get_run(run_id).data.metrics:
            points.update((key, m.step) for m in client.get_metric_history(run_id, key))
    exps = [e.experiment_id for e in client.search_experiments()]
    found = client.search_runs(exps)
    unfinished = [r.info.run_id for r in found if r.info.status != "FINISHED"]
    return {"points": points, "unfinished": unfinished, "runs": len(found)}


def final_state(root: Path, db_url: str) -> dict:
    return {"weights": weights(root), "rows": rows(db_url), "mlflow": mlflow_points(root, db_url)}


def compare(ref: dict, got: dict) -> dict:
    """Differences of a trial's end state from the reference's."""
    lost = sum(sum((ref["rows"][t] - got["rows"][t]).values()) for t in TABLES)
    extra = sum(sum((got["rows"][t] - ref["rows"][t]).values()) for t in TABLES)
    pts, ref_pts = got["mlflow"]["points"], ref["mlflow"]["points"]
    runs = got["rows"]["runs"]
    statuses = [dict(r)["status"] for r in runs.elements()]
    diff = {"weights_equal": got["weights"] == ref["weights"], "rows_lost": lost, "rows_extra": extra,
            "lost_by_table": {t: sum((ref["rows"][t] - got["rows"][t]).values()) for t in TABLES
                              if ref["rows"][t] - got["rows"][t]},
            "first_differences": {t: {"reference_only": list((ref["rows"][t] - got["rows"][t]).elements())[:2],
                                      "trial_only": list((got["rows"][t] - ref["rows"][t]).elements())[:2]}
                                  for t in TABLES if ref["rows"][t] != got["rows"][t]},
            "duplicate_points": sum(n - 1 for n in pts.values() if n > 1),
            "missing_points": len(set(ref_pts) - set(pts)), "extra_points": len(set(pts) - set(ref_pts)),
            "orphaned_runs": (len(statuses) - statuses.count("finished")) + len(got["mlflow"]["unfinished"])
            + max(0, statuses.count("finished") - 1) + max(0, got["mlflow"].get("runs", 1) - 1),
            "mlflow_runs": got["mlflow"].get("runs")}
    diff["exact"] = (diff["weights_equal"] and not lost and not extra and not diff["duplicate_points"]
                     and not diff["missing_points"] and not diff["extra_points"] and not diff["orphaned_runs"])
    return diff


ADMIN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
_scratch = contextlib.ExitStack()  # the PostgreSQL databases db_for made, dropped when the process exits
atexit.register(_scratch.close)


def db_for(backend: str, root: Path) -> str:
    """A fresh experience database: SQLite under root, or a new PostgreSQL database (dropped at exit)."""
    if backend == "sqlite":
        return f"sqlite:///{root / 'exp.db'}"
    from exgrpo_core.store.engine import scratch_postgres_database

    return _scratch.enter_context(scratch_postgres_database(PG.format("postgres"), "fi"))


def drop_created() -> None:
    """Drop the PostgreSQL databases db_for made (their runs' results are already read)."""
    _scratch.close()


def reference_run(work: Path, steps: int, backend: str = "sqlite", overlap: int = 0,
                  sampler: str = "thread") -> tuple[dict, float, dict]:
    """An uninterrupted run in work/reference: the environment the trials share (Prefect home work/prefect),
    its duration in seconds and its end state."""
    env = environment(work / "prefect")
    root = work / "reference"
    root.mkdir(parents=True)
    db = db_for(backend, root)
    t0 = time.monotonic()
    run = run_until_done(train_command(root, db, steps, overlap=overlap, sampler=sampler), env, root, [])
    assert run["finished"], run["failures"]
    assert not run["leaked"], run["leaked"]
    return env, time.monotonic() - t0, final_state(root, db)


SLOW_SAMPLER_S = 2.0  # a trial with an `in_flight` kill: the sampler's sleep before each batch sampled ahead


def plan_kills(rng: random.Random, n: int, duration_s: float, steps: int, overlap: int = 0) -> list[tuple[str, float]]:
    """n kills: time or checkpoint, half each; with overlap a third are `in_flight` (the last step has none)."""
    def one():
        if overlap and rng.random() < 1 / 3:
            return "in_flight", rng.randrange(steps - 1)
        return ("time", round(rng.uniform(0, 0.9 * duration_s), 2)) if rng.random() < 0.5 \
            else ("checkpoint", rng.randrange(steps))
    return [one() for _ in range(n)]


def _save(args, duration: float, trials: list[dict]) -> None:
    from benchmarks.bench_record import save_result

    summary = {"trials": len(trials), "kills": sum(len(t["kills"]) for t in trials),
               "kills_in_checkpoint_write": sum(k["in_checkpoint_write"] for t in trials for k in t["kills"]),
               "kills_in_flight": sum(k["kind"] == "in_flight" for t in trials for k in t["kills"]),
               "kills_batch_in_flight": sum(k.get("batch_in_flight", False) for t in trials for k in t["kills"]),
               "kills_with_spawned_child": sum(k.get("spawned_children", 0) > 0 for t in trials for k in t["kills"]),
               "finished": sum(t["finished"] for t in trials), "exact_resumes": sum(t["exact"] for t in trials),
               "rows_lost": sum(t.get("rows_lost", 0) for t in trials),
               "rows_extra": sum(t.get("rows_extra", 0) for t in trials),
               "duplicate_points": sum(t.get("duplicate_points", 0) for t in trials),
               "missing_points": sum(t.get("missing_points", 0) for t in trials),
               "orphaned_runs": sum(t.get("orphaned_runs", 0) for t in trials),
               "leaked_processes": sum(len(t["leaked"]) for t in trials)}
    print(summary, flush=True)
    name = f"fault_injection_{args.db}" + (f"_overlap{args.overlap}" if args.overlap else "") \
        + (f"_{args.sampler}" if args.sampler != "thread" else "")
    save_result(f"{name}.json", {"db": args.db, "overlap": args.overlap, "sampler": args.sampler,
                                 "steps": args.steps, "seed": args.seed, "reference_s": round(duration, 1),
                                 "summary": summary, "trials": trials})


def main() -> int:
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--max-kills", type=int, default=3, help="kills per trial: 1 to this many")
    ap.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    ap.add_argument("--overlap", type=int, choices=[0, 1], default=0, help="rollout.overlap of every run")
    ap.add_argument("--sampler", choices=["thread", "process"], default="thread",
                    help="rollout.overlap_sampler of every run (process: with --overlap 1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", default=None, help="folder for the runs (default: a temporary one)")
    args = ap.parse_args()
    if args.sampler == "process" and not args.overlap:
        ap.error("--sampler process needs --overlap 1 (without overlap there is no sampler)")
    rng = random.Random(args.seed)
    work = Path(args.work or tempfile.mkdtemp(prefix="fault-injection-"))
    env, duration, ref = reference_run(work, args.steps, args.db, args.overlap, args.sampler)
    print(f"reference: {duration:.1f} s, {sum(sum(c.values()) for c in ref['rows'].values())} rows, "
          f"{len(ref['mlflow']['points'])} MLflow points")
    trials = []
    for i in range(args.trials):
        root = work / f"trial{i}"
        root.mkdir()
        db = db_for(args.db, root)
        kills = plan_kills(rng, rng.randint(1, args.max_kills), duration, args.steps, args.overlap)
        slow = SLOW_SAMPLER_S if any(k == "in_flight" for k, _ in kills) else 0.0
        cmd = train_command(root, db, args.steps, overlap=args.overlap, slow_sampler_s=slow, sampler=args.sampler)
        run = run_until_done(cmd, env, root, kills)
        diff = compare(ref, final_state(root, db)) if run["finished"] else {"exact": False}
        trials.append({"planned": kills, "slow_sampler_s": slow, **run, **diff})
        print(f"trial {i}: {len(run['kills'])} kills ({sum(k['in_checkpoint_write'] for k in run['kills'])} in a "
              f"checkpoint write), exact={diff['exact']}, leaked={len(run['leaked'])} "
              f"{ {k: v for k, v in diff.items() if k != 'exact'} }", flush=True)
        _save(args, duration, trials)  # after every trial: an interrupted benchmark keeps its figures
    return 0


if __name__ == "__main__":
    sys.exit(main())
