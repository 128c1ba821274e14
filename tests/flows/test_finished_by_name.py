"""Naming a finished run never extends it silently: without an explicit run.steps (the CLI's --set, the
form's steps field, the user's own YAML) `exgrpo train` prints one line and exits 0, and the flow ends
AlreadyFinished, leaving the database and MLflow (status, end time, tags) as they were; asking for more
steps continues it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_helpers import sqlite_rows

from flows.train_params import asks_for_steps

ROOT = Path(__file__).resolve().parents[2]


def test_only_an_explicit_run_steps_asks_for_steps(tmp_path):
    assert asks_for_steps(["run.name=x", " run.steps =12"]) and not asks_for_steps(["run.name=x"])
    assert not asks_for_steps([], "tiny") and not asks_for_steps(None, "configs/tiny.yaml")  # the preset's
    own = tmp_path / "mine.yaml"
    own.write_text("preset: tiny\nrun:\n  steps: 20\n")
    assert asks_for_steps([], str(own))
    own.write_text("preset: tiny\nrollout:\n  group_size: 4\n")
    assert not asks_for_steps([], str(own))


def _cli(args):
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "train", "--config", "tiny", *args], cwd=ROOT,
                          env=dict(os.environ), capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


def _state(tmp: Path):
    import mlflow

    db = tmp / "exp.db"
    (run_id, status, step, mlflow_id), = sqlite_rows(db, "select id, status, step, mlflow_run_id from runs")
    run = mlflow.MlflowClient(f"sqlite:///{tmp / 'mlflow.db'}").get_run(mlflow_id)
    counts = [sqlite_rows(db, f"select count(*) from {t}")[0][0] for t in ("trajectories", "step_metrics")]
    return (run_id, status, step, counts, run.info.status, run.info.end_time, run.data.tags,
            sorted(p.name for p in (tmp / "runs" / "named" / "checkpoints").iterdir()))


@pytest.mark.slow
def test_a_finished_run_named_again_trains_only_when_more_steps_are_asked_for(tmp_path, prefect_server,
                                                                             tiny_overrides):
    sets = sum((["--set", o] for o in [*tiny_overrides, "run.name=named"]), [])
    rc, out = _cli([*sets, "--set", "run.steps=2"])
    assert rc == 0, out[-3000:]
    before = _state(tmp_path)
    assert before[1:3] == ("finished", 1)

    rc, out = _cli(sets)  # the preset's 10 steps: not a request for more
    lines = [line for line in out.splitlines() if line.strip()]
    assert rc == 0 and len(lines) == 1, out[-3000:]
    assert lines[0].startswith("finished: run 'named' already finished 2 steps: nothing trained "
                               "(run.steps=10 was not asked for)"), lines
    assert "--set run.steps=N with N > 2" in lines[0]
    assert _state(tmp_path) == before  # database rows, MLflow status, end time and tags, checkpoints

    from flows.train import train
    from flows.train_params import AlreadyFinishedError

    with pytest.raises(AlreadyFinishedError, match="already finished 2 steps"):  # the form: steps left at 0
        train(preset="tiny", run_name="named", steps=0, overrides=tiny_overrides)
    assert _state(tmp_path) == before

    rc, out = _cli([*sets, "--set", "run.steps=3"])  # asked for: it continues
    assert rc == 0 and "resumed run" in out, out[-3000:]
    after = _state(tmp_path)
    assert after[0] == before[0] and after[1:3] == ("finished", 2) and after[3][0] >= before[3][0]
