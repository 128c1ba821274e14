"""One step numbering for everything a user reads (issue 34 item 5): step N is the step that performs
optimiser update N, and step 0 is the start model. A real 2-step `exgrpo train` with an evaluation at
the start and at step 2 and a monitor firing every step: the CLI lines, the Prefect task names and
flow-run logs, the MLflow steps and artifact names, the checkpoint folders and the monitor messages all
say the same numbers; the experience database keeps its 0-based indices, one below (the one boundary).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_helpers import sqlite_rows as _rows

from exgrpo_core import metrics as M

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
# the random tiny model samples near-uniformly: fresh entropy H ~ log 85 > 1 warns at every step
SETS = ["run.name=num", "run.steps=2", "run.checkpoint_every=1", "monitors.fresh_entropy.max=1.0",
        "eval.at_start=true", "eval.every=2", "eval.suites=[bundled:tiny-arith]", "eval.max_questions=4",
        "eval.samples=1", "eval.max_response_tokens=1", "eval.pass_k=[1]"]


@pytest.fixture(scope="module")
def run(tmp_path_factory, prefect_server):
    tmp = tmp_path_factory.mktemp("numbering")
    sets = [f"run.output_dir={tmp / 'runs'}", f"run.db_url=sqlite:///{tmp / 'exp.db'}",
            f"run.mlflow_tracking_uri=sqlite:///{tmp / 'mlflow.db'}", *SETS]
    p = subprocess.run([sys.executable, "-m", "flows.cli", "train", "--config", "configs/tiny.yaml",
                        *sum((["--set", s] for s in sets), [])], cwd=ROOT, env=dict(os.environ),
                       capture_output=True, text=True, timeout=900)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    (run_id, mlflow_id), = _rows(tmp / "exp.db", "select id, mlflow_run_id from runs where name='num'")
    import mlflow

    return tmp, out, run_id, mlflow_id, mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp / 'mlflow.db'}")


def _steps(client, mlflow_id: str, key: str) -> list[int]:
    return [m.step for m in client.get_metric_history(mlflow_id, key)]


def test_cli_checkpoints_monitors_and_evaluations_count_alike(run):
    tmp, out, *_ = run
    assert re.findall(r"^step +(\d+)/2 ", out, re.M) == ["1", "2"], out[-4000:]
    assert re.findall(r"monitor fresh_entropy at step (\d+):", out) == ["1", "2"], out[-4000:]
    assert re.findall(r"eval step (\d+): average", out) == ["0", "2"], out[-4000:]
    ckpts = sorted(p.name for p in (tmp / "runs" / "num" / "checkpoints").iterdir())
    assert ckpts == ["step_000001", "step_000002"]


def test_mlflow_steps_and_artifacts_are_step_numbers(run):
    tmp, _, run_id, mlflow_id, client = run
    assert _steps(client, mlflow_id, M.REWARD_MEAN) == [1, 2]  # one point per (metric, step)
    assert _steps(client, mlflow_id, M.monitor_key("fresh_entropy")) == [1, 2]
    assert _steps(client, mlflow_id, M.eval_key("tiny-arith", "pass@1")) == [0, 2]
    assert client.get_run(mlflow_id).data.tags["exgrpo.step_numbering"] == "updates_done"
    plots = sorted(Path(a.path).name for a in client.list_artifacts(mlflow_id, "plots"))
    evals = sorted(Path(a.path).name for a in client.list_artifacts(mlflow_id, "eval"))
    assert plots == ["step_000001", "step_000002"] and evals == ["step_000000", "step_000002"]
    data = client.download_artifacts(mlflow_id, "plots/step_000002/data.json", str(tmp))
    assert '"step": 2, "first_step": 2' in Path(data).read_text()
    # the database keeps 0-based step indices (resume and old rows unchanged): one below, start at -1
    db = [s for s, in _rows(tmp / "exp.db", "select step from step_metrics where run_id=:r and key=:k "
                                            "order by step", r=run_id, k=M.REWARD_MEAN)]
    ev = sorted({s for s, in _rows(tmp / "exp.db", "select step from eval_results where run_id=:r", r=run_id)})
    assert db == [0, 1] and ev == [-1, 1]


def test_prefect_task_names_and_logs_use_the_same_numbers(run):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterFlowRunId

    _, _, _, mlflow_id, client = run
    flow_run_id = client.get_run(mlflow_id).data.tags["prefect.flow_run_id"]
    with get_client(sync_client=True) as prefect:
        tasks = {t.name for t in prefect.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))}
        logs = [log.message for log in prefect.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))]
    assert {"rollout step 1", "rollout step 2", "checkpoint step 1", "checkpoint step 2", "evaluate at start",
            "evaluate step 2", "pictures step 2"} <= tasks, sorted(tasks)
    text = "\n".join(logs)
    assert re.findall(r"^step +(\d+)/2 ", text, re.M) == ["1", "2"], text[-3000:]
    assert re.findall(r"monitor fresh_entropy at step (\d+):", text) == ["1", "2"], text[-3000:]
