"""A Run from the Prefect form with bad overrides, executed as a process worker executes it (`python -m
prefect.engine`): the flow run ends Failed in its first seconds with one line naming every bad override,
and neither its log nor the process's output holds a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
BAD = ["rollout.group_sizee=4", "train.lr=abc", "nonsense", "model.tiny.num_heads=3"]


def _client():
    from prefect import get_client

    return get_client(sync_client=True)


@pytest.mark.parametrize("overrides, named", [
    (BAD[:3], ["rollout.group_sizee: unknown key", "train.lr: Input should be a valid number",
               "override 'nonsense' must look like dotted.key=value"]),
    (BAD[3:], ["model.tiny.hidden_size (64) must be a multiple of model.tiny.num_heads (3)"]),
])
def test_bad_form_overrides_fail_at_once_in_one_line(prefect_server, tmp_path, overrides, named):
    from prefect.client.schemas.filters import LogFilter
    from prefect.states import Scheduled

    from flows.train import train

    sets = [f"run.output_dir={tmp_path / 'runs'}", f"run.db_url=sqlite:///{tmp_path / 'exp.db'}",
            f"run.mlflow_tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}", *overrides]
    with _client() as c:
        fr = c.create_flow_run(train, parameters={"preset": "tiny", "overrides": sets}, state=Scheduled())
    env = {**os.environ, "PREFECT_API_URL": prefect_server, "PREFECT__FLOW_RUN_ID": str(fr.id),
           "PREFECT__FLOW_ENTRYPOINT": "flows/train.py:train"}
    proc = subprocess.run([sys.executable, "-m", "prefect.engine"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    out = proc.stdout + proc.stderr
    time.sleep(1)  # the last log batch is sent at the process's exit
    with _client() as c:
        run = c.read_flow_run(fr.id)
        logs = c.read_logs(log_filter=LogFilter(flow_run_id={"any_": [fr.id]}))
    assert run.state.is_failed() and run.state.name == "BadParameters", (run.state, out[-3000:])
    assert "\n" not in run.state.message and all(n in run.state.message for n in named), run.state.message
    assert run.total_run_time.total_seconds() < 10, run.total_run_time  # no model, data or database was opened
    assert "Traceback" not in out, out[-3000:]
    text = "\n".join(g.message for g in logs)
    assert "Traceback" not in text and sum(g.level >= 40 for g in logs) <= 1, text[-3000:]
    assert [g.message for g in logs if g.message.startswith("error:")] == [f"error: {run.state.message}"], text
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
