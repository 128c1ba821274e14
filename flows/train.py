"""Prefect training flow: each ExGRPO iteration as a sequence of tasks.

The model, optimiser and store live in the flow process (`Session`); tasks wrap one core call each
and pass plain records. No caching (`NO_CACHE`): every task runs every iteration. MLflow logging and
checkpointing happen in the `log` task from the stats the core returns. Task runs are named by stage
and step; the step lines, a progress and a summary artifact go to Prefect (flows/run_report.py); the
paper's pictures go to MLflow at evaluation and checkpoint steps (flows/plots.py). Which run a flow
run trains (a new one per form run unless named; never a silent no-op): flows/train_params.py.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Callable

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run as current_flow_run

from exgrpo_core import loop, metrics as M
from exgrpo_core.algorithm import selection
from exgrpo_core.config.schema import ExGRPOConfig
from exgrpo_core.run import checkpoint
from exgrpo_core.run.checkpoint import latest_checkpoint
from exgrpo_core.run.db_guard import DatabaseGuard
from exgrpo_core.run.session import Session, open_session
from flows import monitor_events
from flows.dead_attempts import end_dead_attempts
from flows.dependency_errors import database_lost, dependency_error, quiet_dependency_faults
from flows.eval_tasks import TrainingEvaluator
from flows.input_checks import USER_ERRORS, check_form_config
from flows.planned_end import (BadParameters, CancelledEnd, cancel_requested, failed_state, planned_state,
                               quiet_planned_ends)
from flows.plots import write_run_pictures
from flows.run_report import FlowRunReport, cli_equivalent, link_tags, stage_name
from flows.task_args import whole
from flows.tracking import MlflowRun, check_server, resolve_tracking_uri
from flows.train_params import (AlreadyFinishedError, Overrides, Preset, ReplayRatio, RunName, Seed, Steps,
                                asks_for_steps, finished_run, form_problems, run_config)

# Set by the CLI to draw a progress display; called as progress(step, total, metrics).
PROGRESS: list[Callable[[int, int, dict], None]] = []

_task = task(cache_policy=NO_CACHE, persist_result=False)
quiet_planned_ends()  # a worker's process imports this module before running the flow
quiet_dependency_faults()


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
    for fn in PROGRESS:
        fn(step, s.cfg.run.steps, stats)
    return stats


@_task
def checkpoint_step(s: Session, tracker: MlflowRun, step: int) -> None:
    """Checkpoint the completed step, last of all that belongs to it (metrics, monitors, pictures), so a
    kill at any moment either replays the step from the previous checkpoint or finds it whole;
    perf/checkpoint_s is logged just before the rename that makes the checkpoint count."""
    t0, blocked = time.perf_counter(), []

    def record() -> None:  # async writes: the step was blocked only until save() returned
        tracker.log_metrics({M.TIME_CHECKPOINT: blocked[0] if blocked else time.perf_counter() - t0}, step)

    s.save(before_commit=record)
    blocked.append(time.perf_counter() - t0)


def _mark_ended_elsewhere(flow, flow_run, state) -> None:
    """Prefect hook (cancelled / crashed, run by the runner or worker that stopped the flow's process):
    when no live process holds the run any more, record it as killed in the database and MLflow."""
    from pathlib import Path

    from exgrpo_core.run import locks
    from exgrpo_core.store.experience_store import ExperienceStore, resolve_db_url

    cfg, _ = run_config(flow_run.parameters or {}, getattr(flow_run, "name", None), getattr(flow_run, "id", None),
                        retry=getattr(flow_run, "run_count", 1) > 1)
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
def train(preset: Preset = "tiny", run_name: RunName = "", steps: Steps = 0, replay_ratio: ReplayRatio = -1.0,
          seed: Seed = -1, overrides: Overrides = [], config: ExGRPOConfig | None = None,  # noqa: B006
          parent_mlflow_run_id: RunName = "") -> dict:
    """Train with ExGRPO. Without a run name every flow run trains a new run, named
    `<preset>-<flow run name>-<4 hex of its id>` (a Retry of the flow run continues it); with one it
    continues that run (as `exgrpo train`).

    Args:
        preset: A shipped preset in configs/ (tiny: seconds per step; cpu-demo: SmolLM2-135M on CPU;
            paper: the paper's recipe). Python callers may pass a YAML path.
        run_name: Continue (or start) the run of this name; empty: a new run named after this flow run.
        steps: Training iterations (run.steps); 0: the preset's.
        replay_ratio: Share of each batch drawn from the experience pool (buffer.replay_ratio; 0 is
            on-policy GRPO); -1: the preset's.
        seed: Seed of data order, sampling and model init (run.seed); -1: the preset's.
        overrides: Any other dotted.key=value strings, e.g. rollout.group_size=4 (the typed fields win).
        config: The whole config tree; when set, every other field but parent_mlflow_run_id is ignored.
        parent_mlflow_run_id: MLflow run to nest this run under (set by the compare flow).
    """
    started = time.perf_counter()
    params = dict(preset=preset, run_name=run_name, steps=steps, replay_ratio=replay_ratio, seed=seed,
                  overrides=overrides, config=config)
    try:
        cfg, sets = run_config(params, current_flow_run.get_name(), current_flow_run.get_id(),
                               retry=current_flow_run.get_run_count() > 1)
        if sets is not None:  # the form's values, checked before anything starts (the CLI checked its own)
            check_form_config(cfg)
    except USER_ERRORS as e:  # a bad override: Failed at once, one line naming every problem, no traceback
        end = BadParameters(form_problems(params) or " ".join(str(e).split()))
        print(f"error: {end}")
        return failed_state(end)
    check_server(resolve_tracking_uri(cfg))  # a dead MLflow server fails before any work is done
    report = FlowRunReport(cfg.run.name, cfg.run.steps)
    done = finished_run(cfg, extend=sets is None or asks_for_steps(sets))  # config given: the caller decided
    if done:  # never resume a finished run into a no-op that looks like success
        print(done["message"])
        report.nothing_trained(done["message"], done["mlflow_run_id"], done["id"])
        return planned_state("AlreadyFinished", AlreadyFinishedError(done["message"]))
    evaluator = TrainingEvaluator(cfg) if cfg.eval.every or cfg.eval.final else None  # bad suites fail here
    s = open_session(cfg)
    guard = DatabaseGuard(s.store.url)  # an SQLite file deleted or damaged under the run is found
    tracker: MlflowRun | None = None
    try:  # from here on every way out leaves the run with a true status in the database and MLflow
        end_dead_attempts(s.run_dir, cfg.run.name, current_flow_run.get_id())  # holding the lock: they died
        tags = {"exgrpo.run_id": s.run_id, "exgrpo.preset": cfg.preset,
                **link_tags(cli_equivalent(cfg.preset, sets) if sets is not None else None)}
        tracker = MlflowRun(cfg, s.mlflow_run_id, tags=tags, parent_run_id=parent_mlflow_run_id or None)
        s.mlflow_run_id = tracker.run_id
        s.store.update_run(s.run_id, mlflow_run_id=tracker.run_id, status="running")
        with _quiet_task_runs():
            summary = _train_steps(s, cfg, tracker, evaluator, report, started, guard)
        guard.check(full=True)
        tracker.end("FINISHED")
        s.store.update_run(s.run_id, status="finished")
        return summary
    except monitor_events.MonitorStop as e:  # checkpoint_and_stop: planned, Cancelled "Stopped", no traceback
        _record_end(s, tracker, "stopped")
        print(f"run stopped: {e}")
        return planned_state("Stopped", e)  # the caller gets the MonitorStop raised
    except BaseException as e:
        status = end_status(e)
        recorded = _record_end(s, tracker, status, database=not database_lost(e))  # not into a lost file
        if status == "killed" and cancel_requested(e):  # a Cancel: Cancelled now, one line (flows/planned_end.py)
            end = CancelledEnd(f"run {cfg.run.name} cancelled after step {s.step}: {recorded}; a Retry continues it "
                               "from its last checkpoint")
            print(end)
            return planned_state("Cancelled", end)
        fault = dependency_error(e, cfg, s.run_dir, recorded) if status == "failed" else None
        if fault is not None:  # a service died mid-run: one line naming it (flows/dependency_errors.py)
            raise fault from e
        raise
    finally:
        s.close()


class _NoFinishedLines(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Finished in state")


@contextlib.contextmanager
def _quiet_task_runs():
    """No "Finished in state Completed()" line per task run (seven a step) between the step lines; task
    states stay on the Task Runs tab; what tasks print (the evaluation's progress), warnings and errors
    are still logged."""
    log, quiet = logging.getLogger("prefect.task_runs"), _NoFinishedLines()
    log.addFilter(quiet)
    try:
        yield
    finally:
        log.removeFilter(quiet)


def _named(t, stage: str, step: int):
    """Task `t` as the task run '<stage> <step>', its arguments passed whole (flows/task_args.py)."""
    return whole(t.with_options(task_run_name=stage_name(stage, step)))


class _Entropies:
    """H(o) of the responses sampled since the last pictures, split by correctness."""

    def __init__(self, since: int):
        self.since, self.correct, self.incorrect = since, [], []

    def add(self, rollouts) -> None:
        for r in rollouts:
            if r.entropy is not None:
                (self.correct if r.reward > 0 else self.incorrect).append(float(r.entropy))


@_task
def log_pictures(s: Session, tracker: MlflowRun, step: int, stats: dict, ent: _Entropies) -> str:
    """The paper's pictures at this step (flows/plots.py) as MLflow artifacts `plots/step_NNNNNN/` (N: the
    step number, metrics.step_number, as the checkpoint and the MLflow step of the same step)."""
    K, sel = s.cfg.rollout.group_size, s.cfg.selection
    name = f"plots/step_{M.step_number(step):06d}"
    folder = write_run_pictures(
        s.run_dir / name, step=step, since_step=ent.since, group_size=K,
        correct=ent.correct, incorrect=ent.incorrect,
        buckets={k: int(stats.get(M.bucket_key(k), 0)) for k in range(K + 1)},
        replays=s.store.replay_buckets(s.run_id),
        weights=selection.bucket_weights(K, sel.question_weighting, sel.sigma, sel.sigma_unit, sel.mu,
                                         top=s.cfg.reward.continuous))
    tracker.log_artifacts(folder, name)
    return name


def _train_steps(s: Session, cfg: ExGRPOConfig, tracker: MlflowRun, evaluator, report: FlowRunReport,
                 started: float, guard: DatabaseGuard) -> dict:
    if s.resumed_from is not None:
        print(f"resumed run {s.run_id} after step {s.step} (checkpoint {checkpoint.folder_name(s.resumed_from)})")
        if s.step >= cfg.run.steps:
            print(f"run '{cfg.run.name}' already completed {s.step} steps: raise run.steps to continue it, "
                  "or set run.name to start a new run")
    first_step = s.step
    report.start(s.step, tracker, s.run_id)
    stats: dict = {}
    pictures = None
    ent = _Entropies(s.step)
    if evaluator:
        evaluator.start(s, tracker)  # eval.at_start: the starting policy, once per run
    every = cfg.run.checkpoint_every
    for step in range(s.step, cfg.run.steps):
        t0 = time.perf_counter()
        plan = _named(select_questions, "select questions", step)(s)
        rollouts, st_roll = _named(rollout, "rollout", step)(s, plan)
        st_verify = _named(verify, "verify", step)(s, rollouts)
        ent.add(rollouts)
        groups, st_buf = _named(buffer_update, "buffer update", step)(s, plan, rollouts)
        replayed, st_sel = _named(select_trajectories, "select trajectories", step)(s, plan)
        st_train = _named(train_step, "train", step)(s, groups, replayed)
        stats = {**st_roll, **st_verify, **st_buf, **st_sel, **st_train,
                 M.TIME_ITERATION: time.perf_counter() - t0}
        eval_due = bool(evaluator and evaluator.due(step))
        if eval_due:
            evaluator.run(s, tracker, step)  # before the step's checkpoint: a crash re-evaluates this step
        stats = _named(log_step, "log", step)(s, tracker, step, stats)
        guard.check()  # the step's rows reached the database file the run opened
        report.step(step, stats)
        monitor_events.report(s, tracker, step, stats)  # raises MonitorStop after a checkpoint
        ckpt_due = bool(every and (step + 1) % every == 0) or step + 1 == cfg.run.steps
        if eval_due or ckpt_due:
            pictures = _named(log_pictures, "pictures", step)(s, tracker, step, stats, ent)
            ent = _Entropies(step + 1)
        if ckpt_due:  # a crash before this point replays the step from the previous checkpoint
            guard.check(full=True)  # never a checkpoint past a damaged database
            _named(checkpoint_step, "checkpoint", step)(s, tracker, step)
    summary = _summary(s, stats)
    if evaluator and cfg.eval.final:
        summary["eval"] = evaluator.final(s, tracker)
    ckpt = latest_checkpoint(s.run_dir)
    ref = tracker.log_checkpoint(ckpt, with_model=cfg.run.mlflow_log_model) if ckpt else None
    summary.update(_outcome(s, tracker, first_step, started))
    tracker.log_json(summary, "summary.json")
    report.summary(summary=summary, cfg=cfg, tracker=tracker, checkpoint=ref,
                   pictures="plots/step_*" if pictures else None)
    return summary


def end_status(e: BaseException) -> str:
    """"killed" when a signal, Ctrl-C or a Prefect cancellation ended the run, also when it surfaced as
    another error raised while it was handled (say, a state update that failed during the SIGTERM); else
    "failed"."""
    from prefect.exceptions import CancelledRun, ExternalSignal, PrefectSignal

    if not isinstance(e, Exception):
        return "killed"
    stops = (KeyboardInterrupt, SystemExit, ExternalSignal, PrefectSignal, CancelledRun)
    seen: set[int] = set()
    x: BaseException | None = e
    while x is not None and id(x) not in seen:
        if isinstance(x, stops):
            return "killed"
        seen.add(id(x))
        x = x.__cause__ or x.__context__
    return "failed"


def _record_end(s: Session, tracker: MlflowRun | None, status: str, database: bool = True) -> str:
    """Mark the run failed (an error), stopped (by a monitor; MLflow FAILED) or killed (Ctrl-C, a Prefect
    cancellation's SIGTERM) in MLflow and the database; a failure to record is reported, never raised over
    the error that ended the run. Returns where it was recorded, in words."""
    done = []
    try:  # each service on its own: MLflow being down must not leave the database saying `running`
        if tracker is not None:
            tracker.end("FAILED" if status == "stopped" else status.upper())
            done.append("MLflow")
    except Exception as e:  # noqa: BLE001
        print(f"could not record run {s.run_id} as {status} in MLflow ({getattr(tracker, 'uri', '?')}): "
              f"{str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}")
    try:
        if database:  # not into a deleted, replaced or damaged SQLite file
            s.store.update_run(s.run_id, status=status)
            done.insert(0, "the experience database")
    except Exception as e:  # noqa: BLE001
        print(f"could not record run {s.run_id} as {status} in the experience database: "
              f"{str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}")
    return f"recorded {status} in {' and '.join(done)}" if done else f"could not be recorded {status} anywhere"


def _outcome(s: Session, tracker: MlflowRun, first_step: int, started: float) -> dict:
    """What the end of a run reports besides its last step: the step-0 evaluation, the pool and retired-set
    sizes in the database, the wall time, and where to look at the run (flows/run_report.py)."""
    from exgrpo_core.config.redact import mask_text
    from flows.eval_tasks import START_STEP, stored_summary
    from flows.run_report import flow_run_url, look_commands

    state = s.store.buffer_state(s.run_id, s.cfg.rollout.group_size, with_buckets=False)
    look = look_commands(tracker_uri=tracker.uri, mlflow_url=tracker.run_url,
                         db_url=s.store.url.render_as_string(hide_password=False), run_id=s.run_id)
    prefect_url = flow_run_url()
    return {"eval_start": stored_summary(s.store, s.run_id, START_STEP),
            "pool": {"questions": state.pool_questions, "trajectories": state.pool_trajectories,
                     "retired": state.retired_questions},
            "first_step": first_step, "wall_s": time.perf_counter() - started,
            "look": {**look, "prefect": mask_text(prefect_url) if prefect_url else None}}


def _summary(s: Session, last: dict) -> dict:
    return {"run_id": s.run_id, "mlflow_run_id": s.mlflow_run_id, "run_dir": str(s.run_dir),
            "steps": s.step, "replay_active": s.replay_active, "last_metrics": last}
