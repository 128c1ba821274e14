"""End to end: a real tiny `exgrpo train` run trips monitors; one of them checkpoints and stops the run.

What a user sees: the warn firing and the stopping one each reach Prefect's events API (resource
`exgrpo.run.<id>`, related to the flow run, which ends Cancelled "Stopped": a planned end), MLflow (tags, `monitor/<name>`
metrics, status FAILED), the CLI (a warning line, then one `stopped:` line and exit status 3) and the
database (`monitor/<name>` step metrics, status `stopped`); rerunning with the action relaxed resumes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e_helpers import sqlite_rows as _rows

from exgrpo_core import metrics as M
from exgrpo_core.run.checkpoint import latest_checkpoint

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def _train(overrides, extra):
    args = [sys.executable, "-m", "flows.cli", "train", "--config", "configs/tiny.yaml",
            *sum((["--set", o] for o in [*overrides, "run.name=mon", *extra]), [])]
    p = subprocess.run(args, cwd=ROOT, env=dict(os.environ), capture_output=True, text=True, timeout=900)
    return p.returncode, p.stdout + p.stderr


def _client():
    """A client of the session's server (the fixture points Prefect's settings at it)."""
    from prefect.client.orchestration import get_client

    return get_client(sync_client=True)


def _events(run_id: str, want: set[str], timeout_s: float = 180.0) -> dict:
    """The monitor events of one run in Prefect's events API (the server persists them asynchronously)."""
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

    flt = EventFilter(event=EventNameFilter(prefix=["exgrpo.monitor."]),
                      resource=EventResourceFilter(id=[f"exgrpo.run.{run_id}"]))
    deadline = time.time() + timeout_s
    with _client() as client:
        while True:
            found = {e.event: e for e in client.read_events(filter=flt, limit=50).events}
            if want <= set(found) or time.time() > deadline:
                return found
            time.sleep(2)


def test_monitor_stops_a_real_run_and_reports_everywhere(tmp_path, prefect_server, tiny_overrides):
    # the random tiny model samples near-uniformly (H ~ log 85 > 3: fresh_entropy warns at step 1) and
    # almost never answers right (most groups all-wrong: zero_variance > 0.5 stops at step 1, stored 0)
    stop = ["run.steps=4", "monitors.zero_variance.max=0.5", "monitors.zero_variance.action=checkpoint_and_stop"]
    code, out = _train(tiny_overrides, stop)
    assert code == 3, out[-4000:]
    assert "monitor fresh_entropy at step 1: fresh entropy H(o)" in out, out[-4000:]
    stopped = [line for line in out.splitlines() if line.startswith("stopped: ")]
    assert len(stopped) == 1 and "monitor zero_variance at step 1" in stopped[0], out[-4000:]
    assert "Traceback" not in out

    db = tmp_path / "exp.db"
    (run_id, status, step, mlflow_id), = _rows(db, "select id, status, step, mlflow_run_id from runs where name='mon'")
    assert status == "stopped" and step == 0
    fired = dict(_rows(db, "select key, value from step_metrics where run_id=:r and key like 'monitor/%'", r=run_id))
    assert set(fired) == {M.monitor_key("fresh_entropy"), M.monitor_key("zero_variance")}
    assert fired[M.monitor_key("zero_variance")] > 0.5 and fired[M.monitor_key("fresh_entropy")] > 3.0
    assert latest_checkpoint(tmp_path / "runs" / "mon").name == "step_000001"  # named by steps completed
    assert "checkpoint step_000001 written" in stopped[0]

    import mlflow

    run = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(mlflow_id)
    assert run.info.status == "FAILED"
    assert "monitor zero_variance at step 1" in run.data.tags["exgrpo.stopped_by"]
    assert "fresh_entropy" in run.data.tags["exgrpo.monitor.fresh_entropy"]
    assert run.data.metrics[M.monitor_key("zero_variance")] == pytest.approx(fired[M.monitor_key("zero_variance")])

    events = _events(run_id, {"exgrpo.monitor.zero_variance", "exgrpo.monitor.fresh_entropy"})
    ev = events.get("exgrpo.monitor.zero_variance")
    assert ev is not None, f"events found: {sorted(events)}"
    assert ev.payload["step"] == 1 and ev.payload["action"] == "checkpoint_and_stop"  # as the message says
    assert ev.resource["prefect.resource.name"] == "mon"
    flow_runs = [r.id for r in ev.related if r.role == "flow-run"]
    assert len(flow_runs) == 1
    with _client() as client:
        state = client.read_flow_run(flow_runs[0].split(".")[-1]).state
        assert state.is_cancelled() and state.name == "Stopped"

    # the same command with the action relaxed resumes from the stop's checkpoint and finishes
    code, out = _train(tiny_overrides, ["run.steps=2", "monitors.zero_variance.max=0.5"])
    assert code == 0 and "resumed run" in out, out[-4000:]
    (status, step), = _rows(db, "select status, step from runs where id=:r", r=run_id)
    assert status == "finished" and step == 1
    steps = _rows(db, "select distinct step from step_metrics where run_id=:r and key=:k", r=run_id,
                  k=M.monitor_key("zero_variance"))
    assert sorted(s for s, in steps) == [0, 1]  # warned at step 1 this time, and the run went on
