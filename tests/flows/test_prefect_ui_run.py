"""Runs started like the Prefect UI starts them (preset + typed fields, no run name), read back through
the Prefect API and MLflow's client: a new run per flow run, task runs named by stage and step, step
lines in the logs, progress and summary artifacts, MLflow tags linking back, the paper's pictures,
the checkpoint reference and model; resuming a finished run trains nothing and does not look like success.

One 3-step and one 1-step tiny run serve every assertion (CI has 2 cores).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest
from e2e_helpers import sqlite_rows

from exgrpo_core import metrics as M
from exgrpo_core.run.checkpoint import latest_checkpoint

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ui_runs(tmp_path_factory, prefect_server):
    from flows.train import train

    tmp = tmp_path_factory.mktemp("uiruns")
    overrides = [f"run.output_dir={tmp / 'runs'}", f"run.db_url=sqlite:///{tmp / 'exp.db'}",
                 f"run.mlflow_tracking_uri=sqlite:///{tmp / 'mlflow.db'}", "run.mlflow_log_model=true"]
    first = train(preset="tiny", steps=3, seed=1, overrides=overrides, return_state=True)
    second = train(preset="tiny", steps=1, overrides=overrides, return_state=True)  # Run clicked again
    summary = first.result()
    ended = _mlflow(tmp).get_run(summary["mlflow_run_id"]).info.end_time
    again = train(preset="tiny", steps=3, run_name=Path(summary["run_dir"]).name, overrides=overrides,
                  return_state=True)
    return tmp, first, second, again, ended


def _mlflow(tmp):
    import mlflow

    return mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp / 'mlflow.db'}")


def _flow_run_id(state):
    return state.state_details.flow_run_id


def test_each_ui_run_trains_a_new_run_named_after_its_flow_run(ui_runs):
    from prefect import get_client

    tmp, first, second, _, _ = ui_runs
    assert first.is_completed() and second.is_completed()
    a, b = first.result(), second.result()
    with get_client(sync_client=True) as client:
        names = [client.read_flow_run(_flow_run_id(s)).name for s in (first, second)]
    run_names = [Path(x["run_dir"]).name for x in (a, b)]
    for flow_run_name, state, run_name in zip(names, (first, second), run_names):
        assert run_name == f"tiny-{flow_run_name}-{_flow_run_id(state).hex[:4]}"
    assert a["run_id"] != b["run_id"] and a["steps"] == 3 and b["steps"] == 1
    rows = sqlite_rows(tmp / "exp.db", "select name, status, step from runs order by created_at")
    assert rows == [(run_names[0], "finished", 2), (run_names[1], "finished", 0)]
    assert json.loads(sqlite_rows(tmp / "exp.db", "select config_json from runs where id=:r",
                                  r=a["run_id"])[0][0])["run"]["seed"] == 1  # the typed field reached the config


def test_resuming_a_finished_run_is_cancelled_and_leaves_mlflow_alone(ui_runs):
    tmp, first, _, again, ended = ui_runs
    assert again.is_cancelled() and again.name == "AlreadyFinished"
    assert "already finished 3 steps: nothing trained" in again.message
    run = _mlflow(tmp).get_run(first.result()["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.info.end_time == ended, "the no-op touched the old MLflow run"
    assert len(sqlite_rows(tmp / "exp.db", "select id from runs")) == 2


def test_task_runs_logs_and_artifacts_show_the_training(ui_runs):
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, FlowRunFilter, LogFilter

    _, first, _, again, _ = ui_runs
    fid = _flow_run_id(first)
    summary = first.result()
    with get_client(sync_client=True) as client:
        tasks = {t.name for t in client.read_task_runs(flow_run_filter=FlowRunFilter(id={"any_": [fid]}))}
        records = client.read_logs(log_filter=LogFilter(flow_run_id={"any_": [fid]}))
    logs = [log.message for log in records]
    assert not [m for m in records if m.task_run_id and "Finished in state" in m.message]  # no noise per task
    with get_client(sync_client=True) as client:
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id={"any_": [fid]}))
        noop = client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id={"any_": [_flow_run_id(again)]}))
    for step in (1, 2, 3):
        for stage in ("select questions", "rollout", "verify", "buffer update", "select trajectories", "train",
                      "log"):
            assert f"{stage} step {step}" in tasks, sorted(tasks)
    assert {"pictures step 2", "pictures step 3"} <= tasks  # checkpoint_every=2 and the last step
    assert {t for t in tasks if t.startswith("checkpoint")} == {"checkpoint step 2", "checkpoint step 3"}
    lines = [m for m in logs if m.startswith("step ")]
    assert [" ".join(m.split("|")[0].split()) for m in lines] == ["step 1/3", "step 2/3", "step 3/3"], logs
    assert "| reward " in lines[0] and "| replay " in lines[0]
    progress = [a for a in arts if a.type == "progress"]
    assert len(progress) == 1 and progress[0].data == pytest.approx(100.0)
    assert progress[0].description.startswith(f"Training `{Path(summary['run_dir']).name}`: share of its 3 steps done.")
    (md,) = [a for a in arts if a.type == "markdown"]
    assert md.key == "exgrpo-" + Path(summary["run_dir"]).name.lower()
    assert f"/runs/{summary['mlflow_run_id']}?workflowType=machine_learning)" in md.data
    assert f"?run={summary['run_id']})" in md.data and "finished, 3 of 3 steps" in md.data
    assert "manifest SHA-256" in md.data
    table = [line for line in md.data.splitlines() if line.startswith("|")]
    assert table[0] == "| status | finished, 3 of 3 steps |" and table[1] == "|---|---|"  # no empty header row
    assert [a.type for a in noop] == ["markdown"] and "nothing trained" in noop[0].data


def test_mlflow_experiment_is_model_training_and_the_run_links_back(ui_runs):
    tmp, first, second, _, _ = ui_runs
    client = _mlflow(tmp)
    summary = first.result()
    run = client.get_run(summary["mlflow_run_id"])
    exp = client.get_experiment(run.info.experiment_id)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    tags = run.data.tags
    fid = str(_flow_run_id(first))
    assert tags["prefect.flow_run_id"] == fid and fid in tags["prefect.flow_run_url"]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert tags["mlflow.source.git.commit"] == head and tags["exgrpo.git_dirty"] in ("true", "false")
    assert tags["exgrpo.command"]
    name = Path(summary["run_dir"]).name
    assert tags["exgrpo.cli_equivalent"].startswith("exgrpo train --config tiny --set run.output_dir=")
    assert f"--set run.seed=1 --set run.name={name} --set run.resume=never" in tags["exgrpo.cli_equivalent"]
    other = client.get_run(second.result()["mlflow_run_id"]).data.tags["prefect.flow_run_id"]
    assert other == str(_flow_run_id(second))


def test_pictures_checkpoint_reference_and_model_are_mlflow_artifacts(ui_runs, tmp_path):
    tmp, first, _, _, _ = ui_runs
    client = _mlflow(tmp)
    summary = first.result()
    rid = summary["mlflow_run_id"]
    for step in (2, 3):  # step numbers, as the checkpoints and MLflow steps
        files = {Path(f.path).name for f in client.list_artifacts(rid, f"plots/step_{step:06d}")}
        assert files == {"entropy.png", "buckets.png", "replays.png", "data.json"}, files
    data = json.loads(Path(client.download_artifacts(rid, "plots/step_000003/data.json", str(tmp_path))).read_text())
    n = len(data["entropy_correct"]) + len(data["entropy_incorrect"])
    reward = {m.step: m.value for m in client.get_metric_history(rid, M.REWARD_MEAN)}
    assert data["step"] == data["first_step"] == 3 and n > 0
    assert len(data["entropy_correct"]) / n == pytest.approx(reward[3])  # the window is step 3's responses
    for k, count in data["buckets"].items():
        hist = {m.step: m.value for m in client.get_metric_history(rid, M.bucket_key(int(k)))}
        assert hist[3] == count
    replayed = sum(m.value for m in client.get_metric_history(rid, M.REPLAYED_SAMPLES))
    unfilled = sum(m.value for m in client.get_metric_history(rid, M.UNFILLED_SLOTS))
    # the plot counts experiential questions drawn per bucket; one retired by its own step's buffer update
    # has no trajectory left to replay (docs/implementation_details.md, row 11) and counts as an unfilled slot
    assert replayed <= sum(data["replays"].values()) <= replayed + unfilled
    ckpt = latest_checkpoint(Path(summary["run_dir"]))
    tags = client.get_run(rid).data.tags
    assert tags["exgrpo.checkpoint.path"] == str(ckpt.resolve())
    manifest_hash = hashlib.sha256((ckpt / "manifest.json").read_bytes()).hexdigest()
    assert tags["exgrpo.checkpoint.manifest_sha256"] == manifest_hash
    model = {Path(f.path).name for f in client.list_artifacts(rid, "model")}
    assert {"model.safetensors", "config.json", "manifest.json"} <= model and "trainer_state.pt" not in model
    ref = json.loads(Path(client.download_artifacts(rid, "checkpoint/reference.json", str(tmp_path))).read_text())
    assert ref["path"] == str(ckpt.resolve()) and ref["model_logged"] is True
