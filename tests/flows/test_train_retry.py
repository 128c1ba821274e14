"""Prefect's Retry and planned ends of exgrpo-train flow runs, run as a worker runs them.

Each attempt is a `python -m prefect.engine` process for an existing flow run (what a process worker
starts); a Retry is the state the UI's Retry button sets (AwaitingRetry, forced); a cancellation is
the runner's (Cancelling, then SIGTERM to the process; without a runner's cancel intent the engine
records it Crashed). Read back through Prefect's API, MLflow's
client and the experience database:
- a flow run started without a run name, stopped after its first checkpoints, is continued by its
  Retry (the same run, resumed from the checkpoint) and ends with the numbers an uninterrupted run of
  the same seed has; a Retry of the finished flow run ends grey AlreadyFinished;
- planned ends (AlreadyFinished, a monitor's stop) are one line in a Cancelled state, with no ERROR
  record ("Engine execution exited with unexpected exception") in the flow run's log.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e_helpers import sqlite_rows

from exgrpo_core import metrics as M

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
EXACT = (M.REWARD_MEAN, "loss/total")  # numbers a bit-exact resume repeats (timings are not)


def _overrides(tmp: Path) -> list[str]:
    return [f"run.output_dir={tmp / 'runs'}", f"run.db_url=sqlite:///{tmp / 'exp.db'}",
            f"run.mlflow_tracking_uri=sqlite:///{tmp / 'mlflow.db'}", "run.checkpoint_every=1"]


def _client():
    from prefect import get_client

    return get_client(sync_client=True)


def _new_flow_run(params: dict):
    from prefect.states import Scheduled

    from flows.train import train

    with _client() as c:
        return c.create_flow_run(train, parameters=params, state=Scheduled())


def _engine(flow_run_id, url: str) -> subprocess.Popen:
    """One attempt of the flow run in its own process, as a process worker starts it."""
    env = {**os.environ, "PREFECT_API_URL": url, "PREFECT__FLOW_RUN_ID": str(flow_run_id),
           "PREFECT__FLOW_ENTRYPOINT": "flows/train.py:train"}
    return subprocess.Popen([sys.executable, "-m", "prefect.engine"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _attempt(flow_run_id, url: str):
    proc = _engine(flow_run_id, url)
    out, _ = proc.communicate(timeout=900)
    with _client() as c:
        return c.read_flow_run(flow_run_id), out


def _retry(flow_run_id) -> None:
    """What the UI's Retry button does to an ended flow run."""
    from prefect.states import AwaitingRetry

    with _client() as c:
        c.set_flow_run_state(flow_run_id, AwaitingRetry(message="Retry from the UI"), force=True)


def _logs(flow_run_id, since=None):
    from prefect.client.schemas.filters import LogFilter
    from prefect.client.schemas.sorting import LogSort

    time.sleep(1)  # the last batch is sent at the process's exit; the server stores it asynchronously
    with _client() as c:
        logs = c.read_logs(log_filter=LogFilter(flow_run_id={"any_": [flow_run_id]}), sort=LogSort.TIMESTAMP_ASC)
    return [g for g in logs if since is None or g.timestamp > since]


def _series(db: Path, run_id: str) -> dict:
    rows = sqlite_rows(db, "select key, step, value from step_metrics where run_id=:r", r=run_id)
    return {(k, s): v for k, s, v in rows if k in EXACT}


@pytest.fixture(scope="module")
def retried(tmp_path_factory, prefect_server):
    """A 5-step flow run without a run name stopped after its checkpoint of step 2, retried to the end,
    then retried once more; and the same seed trained straight through in one flow run."""
    from flows.train import train

    tmp = tmp_path_factory.mktemp("retry")
    params = {"preset": "tiny", "steps": 5, "seed": 3, "overrides": _overrides(tmp)}
    fr = _new_flow_run(params)
    name = f"tiny-{fr.name}-{fr.id.hex[:4]}"
    proc = _engine(fr.id, prefect_server)
    ckpt = tmp / "runs" / name / "checkpoints" / "step_000002"
    deadline = time.time() + 600
    while not ckpt.is_dir() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.5)
    from prefect.states import Cancelled, Cancelling

    with _client() as c:  # the runner's cancellation: Cancelling, SIGTERM to the process
        c.set_flow_run_state(fr.id, Cancelling(), force=True)
        proc.send_signal(signal.SIGTERM)
        first_out, _ = proc.communicate(timeout=300)
        if not c.read_flow_run(fr.id).state.is_final():
            c.set_flow_run_state(fr.id, Cancelled(message="cancelled by the runner"), force=True)
        cancelled = c.read_flow_run(fr.id)
    killed = sqlite_rows(tmp / "exp.db", "select id, status, step, mlflow_run_id from runs")
    _retry(fr.id)
    resumed, resumed_out = _attempt(fr.id, prefect_server)
    ended = resumed.state.timestamp
    _retry(fr.id)
    again, again_out = _attempt(fr.id, prefect_server)
    straight = train(preset="tiny", steps=5, seed=3, run_name="straight", overrides=_overrides(tmp))
    return dict(tmp=tmp, fr=fr, name=name, cancelled=cancelled, killed=killed, resumed=resumed,
                resumed_out=resumed_out, again=again, again_out=again_out, ended=ended, straight=straight,
                first_out=first_out)


def test_a_retry_of_a_stopped_flow_run_resumes_its_run_exactly(retried):
    r = retried
    state = r["cancelled"].state
    assert state.is_crashed() or state.is_cancelled(), (state, r["first_out"][-3000:])
    (run_id, status, step, mlflow_id), = r["killed"]
    assert status == "killed" and step >= 1, (r["killed"], r["first_out"][-4000:])
    assert r["resumed"].run_count == 2 and r["resumed"].state.is_completed(), r["resumed_out"][-3000:]
    db = r["tmp"] / "exp.db"
    rows = sqlite_rows(db, "select id, status, step, mlflow_run_id from runs where name=:n", n=r["name"])
    assert rows == [(run_id, "finished", 4, mlflow_id)], "the retry did not continue the run it started"
    assert any("resumed run" in g.message for g in _logs(r["fr"].id))
    mine, ref = _series(db, run_id), _series(db, r["straight"]["run_id"])
    assert len(ref) == 5 * len(EXACT) and mine == ref  # every step once, as the uninterrupted run has it
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{r['tmp'] / 'mlflow.db'}")
    run = client.get_run(mlflow_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["exgrpo.command"] == f"python -m prefect.engine (flow run {r['fr'].name}, no deployment)"
    assert [m.step for m in client.get_metric_history(mlflow_id, M.REWARD_MEAN)] == [1, 2, 3, 4, 5]  # step numbers


def test_a_retry_moves_the_flow_runs_one_progress_bar_on(retried):
    from prefect.client.schemas.filters import ArtifactFilter

    from flows.run_report import artifact_key

    with _client() as c:
        arts = c.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id={"any_": [retried["fr"].id]}))
    bars = [(a.key, a.data) for a in arts if a.type == "progress"]
    assert bars == [(f"{artifact_key(retried['name'])}-progress", 100.0)], bars  # not the stopped attempt's too


def test_a_retry_of_a_finished_flow_run_ends_already_finished_quietly(retried):
    r = retried
    state = r["again"].state
    assert state.is_cancelled() and state.name == "AlreadyFinished", (state, r["again_out"][-3000:])
    assert "already finished 5 steps: nothing trained" in state.message
    logs = _logs(r["fr"].id, since=r["ended"])
    assert logs and not [g.message[:200] for g in logs if g.level >= 40], "an ERROR record after a planned end"
    assert logs[-2].message.startswith(f"run '{r['name']}' already finished 5 steps"), [g.message for g in logs[-3:]]
    assert logs[-1].message.startswith("Finished in state AlreadyFinished(")
    assert "Traceback" not in r["again_out"]
    assert len(sqlite_rows(r["tmp"] / "exp.db", "select id from runs where name=:n", n=r["name"])) == 1


def test_a_monitor_stop_is_a_planned_cancelled_end_without_an_error_record(tmp_path, prefect_server):
    stop = ["monitors.zero_variance.max=0.5", "monitors.zero_variance.action=checkpoint_and_stop"]
    fr = _new_flow_run({"preset": "tiny", "steps": 3, "overrides": _overrides(tmp_path) + stop})
    ended, out = _attempt(fr.id, prefect_server)
    assert ended.state.is_cancelled() and ended.state.name == "Stopped", (ended.state, out[-3000:])
    assert "monitor zero_variance at step 1" in ended.state.message
    logs = _logs(fr.id)
    assert not [g.message[:200] for g in logs if g.level >= 40], "an ERROR record after a planned end"
    assert logs[-2].message.startswith("run stopped: monitor zero_variance at step 1"), [g.message for g in logs[-3:]]
    assert logs[-1].message.startswith("Finished in state Stopped(")
    assert "Traceback" not in out
    assert sqlite_rows(tmp_path / "exp.db", "select status from runs") == [("stopped",)]
