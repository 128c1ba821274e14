"""A UI Cancel of a training flow run on a process worker, as the Prefect UI's Cancel button does it (the
flow run set Cancelling; the worker sends the cancel intent, then SIGTERM, to the flow's process).

Before: the engine logged "Finished in state Running()" (and "Crash detected!" from the task run the SIGTERM
interrupted), and the flow run stayed Cancelling until the worker had loaded the flow again to run its hooks
(25 s here, 1 min 40 s on a loaded machine). Now the flow records the run killed (database, MLflow), frees
the run lock and ends its flow run Cancelled itself, with one line saying so.

Run: .venv/bin/python -m pytest tests/flows/test_ui_cancel.py -x -q
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from e2e_helpers import sqlite_rows

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def _client():
    from prefect import get_client

    return get_client(sync_client=True)


@pytest.fixture
def deployment(prefect_server, tmp_path):
    """The exgrpo-train flow deployed to a fresh process pool, served by one worker; yields the deployment id."""
    from prefect.client.schemas.actions import WorkPoolCreate

    pool = f"cancel-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "PREFECT_API_URL": prefect_server, "PYTHONPATH": str(ROOT),
           "PREFECT_WORKER_QUERY_SECONDS": "2"}
    with _client() as c:
        c.create_work_pool(WorkPoolCreate(name=pool, type="process"))
        dep = c.create_deployment(c.create_flow_from_name("exgrpo-train"), "cancel", work_pool_name=pool,
                                  entrypoint="flows/train.py:train", pull_steps=[
                                      {"prefect.deployments.steps.set_working_directory": {"directory": str(ROOT)}}])
    worker = subprocess.Popen([sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, "--type", "process"],
                              cwd=tmp_path, env=env, stdout=open(tmp_path / "worker.log", "w"),
                              stderr=subprocess.STDOUT, start_new_session=True)
    yield dep
    try:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(worker.pid, signal.SIGKILL)


def test_a_ui_cancel_ends_cancelled_at_once_in_one_line(deployment, tmp_path):
    from prefect.client.schemas.filters import LogFilter
    from prefect.client.schemas.sorting import LogSort
    from prefect.states import Cancelling

    from exgrpo_core.run import locks

    runs = tmp_path / "runs"
    overrides = [f"run.output_dir={runs}", f"run.db_url=sqlite:///{tmp_path / 'exp.db'}",
                 f"run.mlflow_tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}", "run.checkpoint_every=2"]
    with _client() as c:
        fr = c.create_flow_run_from_deployment(deployment, parameters={"preset": "tiny", "steps": 500,
                                                                        "overrides": overrides})
        deadline = time.time() + 600
        while not list(runs.glob("*/checkpoints/step_*")):  # training, past its first checkpoint
            assert time.time() < deadline and not c.read_flow_run(fr.id).state.is_final(), c.read_flow_run(fr.id).state
            time.sleep(0.5)
        asked = time.time()
        c.set_flow_run_state(fr.id, Cancelling(), force=True)  # the UI's Cancel button
        while not c.read_flow_run(fr.id).state.is_final():
            assert time.time() - asked < 120, "still Cancelling"
            time.sleep(0.25)
        took = time.time() - asked
        time.sleep(3)  # the worker finishes its own cancellation sequence: the state stays the flow's
        state = c.read_flow_run(fr.id).state
        logs = [g.message for g in c.read_logs(log_filter=LogFilter(flow_run_id={"any_": [fr.id]}),
                                               sort=LogSort.TIMESTAMP_ASC)]
    name = f"tiny-{fr.name}-{fr.id.hex[:4]}"
    assert state.is_cancelled() and state.name == "Cancelled", state
    assert took < 20, f"Cancelled {took:.0f} s after the Cancel"
    ours = [m for m in logs if m.startswith(f"run {name} cancelled after step ")]
    assert len(ours) == 1 and ours[0].endswith(": recorded killed in the experience database and MLflow; a Retry "
                                               "continues it from its last checkpoint"), logs[-5:]
    assert state.message == ours[0]
    assert not [m for m in logs if m.startswith(("Crash detected!", "Finished in state Running"))], logs[-5:]
    ((status, mlflow_id),) = sqlite_rows(tmp_path / "exp.db", "select status, mlflow_run_id from runs")
    assert status == "killed"
    import mlflow

    assert mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(mlflow_id).info.status == "KILLED"
    locks.lock_run(runs / name, name, f"sqlite:///{tmp_path / 'exp.db'}")  # free: nothing holds the run
    locks.unlock_run(runs / name)


@pytest.mark.filterwarnings("ignore:Logger 'prefect.task_runs' attempted to send logs")
def test_a_cancelled_task_runs_crash_line_is_dropped_only_for_a_cancel(caplog):
    """The task run a Cancel's SIGTERM interrupts logs "Crash detected!" (Prefect's task engine); a crash of
    a task run without the worker's cancel intent is still logged."""
    from prefect._internal import control_listener

    from flows.planned_end import quiet_planned_ends

    quiet_planned_ends()
    log = logging.getLogger("prefect.task_runs")
    with caplog.at_level(logging.ERROR, logger="prefect.task_runs"):
        log.error("Crash detected! Execution was cancelled by the runtime environment.")
        assert [r.getMessage() for r in caplog.records] == [
            "Crash detected! Execution was cancelled by the runtime environment."]
        control_listener._set_intent("cancel")
        try:
            log.error("Crash detected! Execution was cancelled by the runtime environment.")
            log.error("Task run failed")
        finally:
            control_listener.clear_intent()
    assert [r.getMessage() for r in caplog.records] == [
        "Crash detected! Execution was cancelled by the runtime environment.", "Task run failed"]


def test_only_a_sigterm_can_be_a_cancel():
    """A Ctrl-C or an error is never taken for a Cancel (nor sent to ask the server); a SIGTERM under another
    error raised while it was handled is."""
    from prefect._internal import control_listener
    from prefect.exceptions import TerminationSignal

    from flows.planned_end import cancel_requested

    wrapped = RuntimeError("a state update failed during the SIGTERM")
    wrapped.__context__ = TerminationSignal(signal.SIGTERM)
    control_listener._set_intent("cancel")
    try:
        assert not cancel_requested(KeyboardInterrupt()) and not cancel_requested(RuntimeError("boom"))
        assert cancel_requested(TerminationSignal(signal.SIGTERM)) and cancel_requested(wrapped)
    finally:
        control_listener.clear_intent()
