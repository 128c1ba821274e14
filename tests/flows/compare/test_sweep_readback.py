"""`exgrpo sweep` on a real Prefect server: its table is the flow run's Prefect artifact, and a failed sweep
keeps the report built from finished children (issue 34 item 9).

One child (tiny, 2 steps, one grid point, seed 0) is trained in-process first; the sweep then finds it
finished in the experience database and reads it back (the deployment's pool has no worker, so a submitted
child would never run). Widened to seed 1, whose new child is cancelled while it waits, the sweep fails
(exit 2) and its report goes to `incomplete/`: the finished report, on disk, in the MLflow parent run and
as the `exgrpo-<name>-sweep` artifact, stays as it was.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from test_parallel_readback import _artifact, _deployment, _run_cancelling_new_children

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]


def test_sweep_publishes_its_table_and_a_failed_sweep_keeps_the_finished_report(tmp_path, prefect_server):
    import mlflow

    from exgrpo_core.config.redact import hide
    from flows.compare.grid import build_children
    from flows.train import train

    name = f"sw{uuid.uuid4().hex[:6]}"
    sets = ["run.steps=2", f"run.output_dir={tmp_path / 'runs'}", f"run.db_url=sqlite:///{tmp_path / 'exp.db'}",
            f"run.mlflow_tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}"]
    (child,) = build_children("tiny", sets, ["train.lr=1e-6"], "0", name, evaluate=False)
    train(preset="tiny", config=hide(child.cfg))

    cmd = [sys.executable, "-m", "flows.cli", "sweep", "--config", "tiny", "--grid", "train.lr=1e-6",
           "--name", name, "--no-eval", "--deployment", _deployment(prefect_server),
           *sum((["--set", s] for s in sets), [])]
    env = {**os.environ, "PREFECT_API_URL": prefect_server}
    done = subprocess.run([*cmd, "--seeds", "0"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "1 found (1 finished in the database), 0 to submit" in out, out[-4000:]
    report = tmp_path / "runs" / name / f"sweep_{name}.md"
    good = report.read_text()
    assert "| finished |" in good
    assert _artifact(f"exgrpo-{name}-sweep") == good  # the table in Prefect, not a log line

    code, out, cancelled = _run_cancelling_new_children([*cmd, "--seeds", "0-1"], env, name, 1)
    assert code == 2, out[-4000:]
    assert "1 of 2 children did not finish" in out and "incomplete" in out, out[-4000:]
    assert cancelled == [f"{name}-train.lr-1e-6-s1"]
    assert report.read_text() == good, "the failed sweep replaced the report of finished children"
    marked = (report.parent / "incomplete" / report.name).read_text()
    assert "| cancelled |" in marked and "| finished |" in marked
    assert _artifact(f"exgrpo-{name}-sweep") == good and _artifact(f"exgrpo-{name}-incomplete") == marked

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name(child.cfg.run.mlflow_experiment)
    (parent,) = client.search_runs([exp.experiment_id], f"tags.`exgrpo.sweep` = '{name}'")
    md = client.download_artifacts(parent.info.run_id, report.name, str(tmp_path / "dl"))
    assert Path(md).read_text() == good, "the failed sweep replaced the parent run's report"
    tags = parent.data.tags  # where the sweep came from, as a comparison's parent says
    assert tags["prefect.flow_run_id"] in tags["prefect.flow_run_url"] and tags["mlflow.source.git.commit"], tags
    assert "sweep" in tags["exgrpo.command"], tags
