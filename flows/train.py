"""Prefect training flow: each ExGRPO iteration as a sequence of tasks.

The model, optimiser and store live in the flow process (`Session`); tasks wrap one core call each
and pass plain records. No caching (`NO_CACHE`): every task runs every iteration. MLflow logging and
checkpointing happen in the `log` task from the stats the core returns.
"""

from __future__ import annotations

import time
from typing import Callable

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from exgrpo_core import loop, metrics as M
from exgrpo_core.config import ExGRPOConfig
from exgrpo_core.config_io import load_config
from exgrpo_core.session import Session, open_session
from flows.eval_tasks import TrainingEvaluator
from flows.tracking import MlflowRun, check_server, resolve_tracking_uri

# Set by the CLI to draw a progress display; called as progress(step, total, metrics).
PROGRESS: list[Callable[[int, int, dict], None]] = []

_task = task(cache_policy=NO_CACHE, persist_result=False)


@_task
def select_questions(s: Session) -> loop.BatchPlan:
    return loop.plan_batch(s)


@_task
def rollout(s: Session, plan: loop.BatchPlan):
    return loop.generate(s, plan)


@_task
def verify(s: Session, rollouts) -> dict:
    return loop.verify(s, rollouts)


@_task
def buffer_update(s: Session, plan: loop.BatchPlan, rollouts):
    return loop.update_buffer(s, plan, rollouts)


@_task
def select_trajectories(s: Session, plan: loop.BatchPlan):
    return loop.select_trajectories(s, plan)


@_task
def train_step(s: Session, groups, replayed) -> dict:
    return loop.train(s, groups, replayed)


@_task
def log_step(s: Session, tracker: MlflowRun, step: int, stats: dict) -> dict:
    t0 = time.perf_counter()
    stats = {**stats, **loop.buffer_snapshot(s)}
    s.store.log_metrics(s.run_id, step, stats)
    s.store.update_run(s.run_id, step=step, status="running")
    tracker.log_metrics(stats, step)
    stats[M.TIME_LOG] = time.perf_counter() - t0
    s.store.log_metrics(s.run_id, step, {M.TIME_LOG: stats[M.TIME_LOG]})
    tracker.log_metrics({M.TIME_LOG: stats[M.TIME_LOG]}, step)
    s.step = step + 1
    every = s.cfg.run.checkpoint_every
    if (every and s.step % every == 0) or s.step == s.cfg.run.steps:
        t1 = time.perf_counter()
        s.save()  # a crash before this point replays the step from the previous checkpoint
        tracker.log_metrics({M.TIME_CHECKPOINT: time.perf_counter() - t1}, step)
    for fn in PROGRESS:
        fn(step, s.cfg.run.steps, stats)
    return stats


def _mark_ended_elsewhere(flow, flow_run, state) -> None:
    """Prefect hook (cancelled / crashed, run by the runner or worker that stopped the flow's process):
    when no live process holds the run any more, record it as killed in the database and MLflow."""
    from pathlib import Path

    from exgrpo_core import locks
    from exgrpo_core.store.experience_store import ExperienceStore, resolve_db_url

    p = flow_run.parameters or {}
    cfg = (ExGRPOConfig.model_validate(p["config"]) if p.get("config")
           else load_config(p.get("preset", "tiny"), p.get("overrides") or []))
    run_dir = Path(cfg.run.output_dir).resolve() / cfg.run.name
    if locks.holds(run_dir):  # the flow runs in this process: its own `except` records the end
        return
    db_url = resolve_db_url(cfg.run.db_url, run_dir)
    try:
        locks.lock_run(run_dir, cfg.run.name, db_url)
    except locks.RunLockedError:
        return  # still alive: it records its own end
    try:
        with ExperienceStore(db_url) as store:
            run_id = store.find_run_by_name(cfg.run.name)
            row = store.get_run(run_id) if run_id else None
            if row and row["status"] == "running":
                store.update_run(run_id, status="killed")
                if row["mlflow_run_id"]:
                    import mlflow

                    mlflow.MlflowClient(resolve_tracking_uri(cfg)).set_terminated(row["mlflow_run_id"], "KILLED")
    finally:
        locks.unlock_run(run_dir)


@flow(name="exgrpo-train", log_prints=True, on_cancellation=[_mark_ended_elsewhere],
      on_crashed=[_mark_ended_elsewhere])
def train(preset: str = "tiny", overrides: list[str] | None = None,
          config: ExGRPOConfig | None = None, parent_mlflow_run_id: str | None = None) -> dict:
    """Train with ExGRPO: `preset` names a YAML in configs/, `overrides` are dotted.key=value strings.

    `config`, when given, is used as is (preset and overrides are ignored). `parent_mlflow_run_id`
    nests this run's MLflow run under a comparison's parent run.

    Args:
        preset: A preset in configs/ (tiny, cpu-demo, paper) or a path to a YAML file.
        overrides: dotted.key=value strings applied to the preset, e.g. run.steps=20.
        config: The whole config tree; when set, preset and overrides are ignored.
        parent_mlflow_run_id: MLflow run to nest this run under (set by the compare flow).
    """
    cfg = config or load_config(preset, overrides or [])
    check_server(resolve_tracking_uri(cfg))  # a dead MLflow server fails before any work is done
    evaluator = TrainingEvaluator(cfg) if cfg.eval.every or cfg.eval.final else None  # bad suites fail here
    s = open_session(cfg)
    tracker: MlflowRun | None = None
    try:  # from here on every way out leaves the run with a true status in the database and MLflow
        tracker = MlflowRun(cfg, s.mlflow_run_id, tags={"exgrpo.run_id": s.run_id, "exgrpo.preset": cfg.preset},
                            parent_run_id=parent_mlflow_run_id)
        s.mlflow_run_id = tracker.run_id
        s.store.update_run(s.run_id, mlflow_run_id=tracker.run_id, status="running")
        summary = _train_steps(s, cfg, tracker, evaluator)
        tracker.end("FINISHED")
        s.store.update_run(s.run_id, status="finished")
        return summary
    except BaseException as e:
        _record_end(s, tracker, "failed" if isinstance(e, Exception) else "killed")
        raise
    finally:
        s.close()


def _train_steps(s: Session, cfg: ExGRPOConfig, tracker: MlflowRun, evaluator) -> dict:
    if s.resumed_from is not None:
        print(f"resumed run {s.run_id} after step {s.resumed_from}")
        if s.step >= cfg.run.steps:
            print(f"run '{cfg.run.name}' already completed {s.step} steps: raise run.steps to continue it, "
                  "or set run.name to start a new run")
    stats: dict = {}
    if evaluator:
        evaluator.start(s, tracker)  # eval.at_start: the starting policy, once per run
    for step in range(s.step, cfg.run.steps):
        t0 = time.perf_counter()
        plan = select_questions(s)
        rollouts, st_roll = rollout(s, plan)
        st_verify = verify(s, rollouts)
        groups, st_buf = buffer_update(s, plan, rollouts)
        replayed, st_sel = select_trajectories(s, plan)
        st_train = train_step(s, groups, replayed)
        stats = {**st_roll, **st_verify, **st_buf, **st_sel, **st_train,
                 M.TIME_ITERATION: time.perf_counter() - t0}
        if evaluator and evaluator.due(step):
            evaluator.run(s, tracker, step)  # before log_step checkpoints: a crash re-evaluates this step
        stats = log_step(s, tracker, step, stats)
    summary = _summary(s, stats)
    if evaluator and cfg.eval.final:
        summary["eval"] = evaluator.final(s, tracker)
    tracker.log_json(summary, "summary.json")
    return summary


def _record_end(s: Session, tracker: MlflowRun | None, status: str) -> None:
    """Mark the run failed (an error) or killed (Ctrl-C, a Prefect cancellation's SIGTERM) in MLflow and
    the database; a failure to record is reported, never raised over the error that ended the run."""
    try:
        if tracker is not None:
            tracker.end(status.upper())
        s.store.update_run(s.run_id, status=status)
    except Exception as e:  # noqa: BLE001
        print(f"could not record run {s.run_id} as {status}: {e}")


def _summary(s: Session, last: dict) -> dict:
    return {"run_id": s.run_id, "mlflow_run_id": s.mlflow_run_id, "run_dir": str(s.run_dir),
            "steps": s.step, "replay_active": s.replay_active, "last_metrics": last}
