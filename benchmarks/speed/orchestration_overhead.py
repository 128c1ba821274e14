"""Share of a training iteration spent on orchestration: Prefect task handling, MLflow logging, database writes.

    python benchmarks/speed/orchestration_overhead.py --config tiny --steps 12
    python benchmarks/speed/orchestration_overhead.py --config cpu-demo --steps 4

Runs the real training flow (`flows.train.train`: Prefect ephemeral API unless PREFECT_API_URL is set,
local MLflow, SQLite) and times, per iteration, with wrappers installed by this script only:
  - wall: from one iteration's first task call to the next one's (the last: to the end of its log task);
  - prefect: each task call seen from the flow minus the time inside the task function, plus flow glue;
  - mlflow: `MlflowRun.log_metrics`; checkpoint: `Session.save` (reported, not counted as overhead);
  - db_writes: `ExperienceStore.log_metrics / update_run / record_replays` (metrics and run bookkeeping)
    and, separately, `apply_buffer_update` (the experience transaction, part of the algorithm);
  - db_reads: `buffer_state / retired_uids / candidates` (selection inputs, part of the algorithm).
Overhead = prefect + mlflow + metric/bookkeeping db writes. Medians over steps after the first; the
last step (it checkpoints) is kept but its checkpoint time is excluded from wall.
Writes benchmarks/results/orchestration_overhead_<preset>.json.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

TASKS = ["select_questions", "rollout", "verify", "buffer_update", "select_trajectories", "train_step", "log_step"]
STORE = {"log_metrics": "db_writes", "update_run": "db_writes", "record_replays": "db_writes",
         "apply_buffer_update": "db_experience", "buffer_state": "db_reads", "retired_uids": "db_reads",
         "candidates": "db_reads"}


class Clock:
    """Per-step sums of named durations; `step` advances when the first task of an iteration starts."""

    def __init__(self):
        self.step = -1
        self.rows: list[dict[str, float]] = []
        self.starts: list[float] = []
        self.end = 0.0

    def add(self, key: str, dt: float) -> None:
        if self.step >= 0:
            self.rows[self.step][key] += dt

    def timed(self, key: str, fn):
        @functools.wraps(fn)
        def wrapper(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.add(key, time.perf_counter() - t0)
        return wrapper


def instrument(clock: Clock, flows_train, tracking, store_cls, session_cls, plain: bool, walked: bool) -> None:
    """Wrap the flow's tasks (outside, at `flows.train._named`, and inside), MLflow logging, store calls
    and checkpoints.

    plain: call each task's function directly instead of through Prefect (the flow run stays), the
    bound on what fewer tasks per iteration could save. walked: pass the arguments as Prefect does by
    default, walking into each (the flow passes them whole: flows/task_args.py).
    """
    for name in TASKS:
        task = getattr(flows_train, name)
        task.fn = clock.timed("inside_tasks", task.fn)
    if walked:
        flows_train.whole = lambda task: task
    named = flows_train._named

    def timed_named(task, stage, step):
        if task.name not in TASKS:
            return named(task, stage, step)
        call = task.fn if plain else named(task, stage, step)

        def outer(*a, **kw):
            if task.name == TASKS[0]:
                clock.step += 1
                clock.rows.append(defaultdict(float))
                clock.starts.append(time.perf_counter())
            t0 = time.perf_counter()
            try:
                return call(*a, **kw)
            finally:
                clock.add("task_calls", time.perf_counter() - t0)
                clock.end = time.perf_counter()
        return outer

    flows_train._named = timed_named
    tracking.MlflowRun.log_metrics = clock.timed("mlflow", tracking.MlflowRun.log_metrics)
    for method, key in STORE.items():
        setattr(store_cls, method, clock.timed(key, getattr(store_cls, method)))
    session_cls.save = clock.timed("checkpoint", session_cls.save)


def per_step(clock: Clock) -> list[dict[str, float]]:
    out = []
    for i, row in enumerate(clock.rows):
        stop = clock.starts[i + 1] if i + 1 < len(clock.starts) else clock.end
        prefect = stop - clock.starts[i] - row["inside_tasks"]  # the checkpoint runs inside log_step
        wall = stop - clock.starts[i] - row["checkpoint"]
        overhead = prefect + row["mlflow"] + row["db_writes"]
        out.append({"wall": wall, "prefect": prefect, "mlflow": row["mlflow"], "db_writes": row["db_writes"],
                    "db_experience": row["db_experience"], "db_reads": row["db_reads"],
                    "checkpoint": row["checkpoint"], "overhead": overhead, "overhead_share": overhead / wall})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="tiny")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--tasks", choices=["prefect", "walked", "plain"], default="prefect",
                    help="walked: Prefect tasks with every argument walked (Prefect's default, the flow's "
                         "before task_args.whole); plain: stage functions called directly (no Prefect tasks)")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--tag", default="", help="suffix of the results file")
    ap.add_argument("--set", action="append", default=[], help="extra config overrides")
    args = ap.parse_args()
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")  # busy machines

    import flows.train as flows_train
    from benchmarks.bench_record import save_result
    from exgrpo_core.config.load import load_config
    from exgrpo_core.run.session import Session
    from exgrpo_core.store.experience_store import ExperienceStore
    from flows import tracking

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    clock = Clock()
    instrument(clock, flows_train, tracking, ExperienceStore, Session, plain=args.tasks == "plain",
               walked=args.tasks == "walked")
    out_dir = Path(tempfile.mkdtemp(prefix="exgrpo-orch-"))
    cfg = load_config(args.config, [f"run.output_dir={out_dir}", f"run.steps={args.steps}",
                                    "run.checkpoint_every=0", "run.resume=never", *args.set])
    flows_train.train(preset=cfg.preset, config=cfg)
    rows = per_step(clock)
    kept = rows[1:] or rows
    med = {k: statistics.median(r[k] for r in kept) for k in rows[0]}
    print(f"\n{args.config}: median seconds per iteration over steps 1..{len(rows) - 1} "
          f"(load {os.getloadavg()[0]:.2f})")
    for k in ("wall", "prefect", "mlflow", "db_writes", "overhead", "db_experience", "db_reads", "checkpoint"):
        print(f"{k:<14} {med[k]:>9.4f} {med[k] / med['wall']:>7.1%}")
    print(f"{'overhead share (median of per-step shares)':<44} {med['overhead_share']:.1%}")
    tag = "_".join(t for t in (args.tasks if args.tasks != "prefect" else "", args.tag) if t)
    name = f"orchestration_overhead_{args.config}{'_' + tag if tag else ''}.json"
    save_result(name, {"preset": args.config, "overrides": args.set, "steps": args.steps, "tasks": args.tasks,
                       "threads": torch.get_num_threads(),
                       "median_seconds": med, "per_step": rows})


if __name__ == "__main__":
    main()
