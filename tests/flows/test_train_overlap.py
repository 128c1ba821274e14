"""`exgrpo train` with rollout.overlap=1 through the Prefect flow (issue 47, first increment): a 3-step run
finishes, each step after the first trains on rollouts sampled one step ahead (fresh staleness 1), and the
trajectories' step column holds the policy version that sampled them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_helpers import sqlite_rows as _rows

from exgrpo_core import metrics as M

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("sampler", ["thread", "process"])  # rollout.overlap_sampler
def test_the_flow_trains_with_overlap_one(tmp_path, prefect_server, sampler):
    sets = [f"run.output_dir={tmp_path / 'runs'}", f"run.db_url=sqlite:///{tmp_path / 'exp.db'}",
            f"run.mlflow_tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}", "run.name=ov", "run.steps=3",
            "run.checkpoint_every=1", "rollout.overlap=1", "buffer.store_all_rollouts=true",
            f"rollout.overlap_sampler={sampler}"]
    p = subprocess.run([sys.executable, "-m", "flows.cli", "train", "--config", "configs/tiny.yaml",
                        *sum((["--set", s] for s in sets), [])], cwd=ROOT, env=dict(os.environ),
                       capture_output=True, text=True, timeout=900)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    db = tmp_path / "exp.db"
    (run_id,), = _rows(db, "select id from runs where name='ov'")
    stale = _rows(db, "select step, value from step_metrics where run_id=:r and key=:k order by step",
                  r=run_id, k=M.FRESH_STALENESS)
    assert [tuple(r) for r in stale] == [(0, 0.0), (1, 1.0), (2, 1.0)], out[-4000:]
    versions = _rows(db, "select collected_step, step from trajectories where run_id=:r", r=run_id)
    assert versions and all(c - s == (c > 0) for c, s in versions)
