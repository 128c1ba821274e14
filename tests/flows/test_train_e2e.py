"""End to end: `exgrpo train --config configs/tiny.yaml` through a real Prefect server, SQLite and MLflow.

Checks what a user would: the weights moved, the database holds trajectories and question states,
replay switched on and replayed samples were trained on, solved questions were retired, MLflow has
every declared metric; then a run killed mid-way resumes from its checkpoint with nothing lost.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e_helpers import sqlite_rows as _rows
import torch

from exgrpo_core import metrics as M
from exgrpo_core.models.load import load_policy
from exgrpo_core.run.checkpoint import latest_checkpoint

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def _cli(args, env_extra=None, **kw):
    env = {**os.environ, **(env_extra or {})}
    return subprocess.Popen([sys.executable, "-m", "flows.cli", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def _run_cli(args, timeout=600):
    proc = _cli(args)
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-4000:]
    return out


def test_tiny_training_run_end_to_end(tmp_path, prefect_server, tiny_overrides):
    steps = 10
    args = ["train", "--config", "configs/tiny.yaml", *sum((["--set", o] for o in tiny_overrides), []),
            "--set", f"run.steps={steps}", "--set", "run.name=e2e"]
    out = _run_cli(args)
    assert f"step {steps:>4}/{steps}" in out, out[-3000:]
    db = tmp_path / "exp.db"
    (run_id, status, step, replay_started, K), = _rows(
        db, "select id, status, step, replay_started_step, group_size from runs where name='e2e'")
    assert status == "finished" and step == steps - 1

    # weights changed: compare the final checkpoint with the seeded initial tiny model
    init, _ = load_policy("tiny", tiny={"hidden_size": 64, "num_layers": 2, "num_heads": 4,
                                        "intermediate_size": 128}, seed=0)
    final, _ = load_policy(str(latest_checkpoint(tmp_path / "runs" / "e2e")))
    unchanged = [n for n, p in init.state_dict().items() if torch.equal(p, final.state_dict()[n])]
    assert len(unchanged) < len(init.state_dict()) / 4, f"parameters not updated: {unchanged}"

    # the experience database
    n_traj, = _rows(db, "select count(*) from trajectories where run_id=:r", r=run_id)[0]
    assert n_traj > 0
    states = _rows(db, "select latest_k, retired from question_states where run_id=:r and latest_k is not null",
                   r=run_id)
    assert states, "no question was verified"
    assert replay_started is not None, "replay never became active"
    replays, = _rows(db, "select count(*) from replays where run_id=:r", r=run_id)[0]
    assert replays > 0
    metrics = dict(_rows(db, "select key, sum(value) from step_metrics where run_id=:r group by key", r=run_id))
    assert metrics[M.REPLAYED_SAMPLES] > 0 and metrics[M.REPLAY_TOKENS] > 0, "replayed samples were not trained on"
    solved = _rows(db, "select count(distinct question_id) from group_results where run_id=:r and k = n",
                   r=run_id)[0][0]
    retired = [r for r in states if r[1]]
    assert solved > 0, "no group was ever fully solved in 10 tiny steps (the tiny preset should get there)"
    assert len(retired) == solved, "every question solved by its whole group is retired, and only those"
    for k, is_retired in states:
        if k == K:
            assert is_retired, "a question whose latest group is all correct is not retired"

    # MLflow holds every declared per-step metric
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    (mlflow_id,), = _rows(db, "select mlflow_run_id from runs where id=:r", r=run_id)
    run = client.get_run(mlflow_id)
    required = set(M.STEP_METRICS) - {M.TIME_CHECKPOINT}
    missing = required - set(run.data.metrics)
    assert not missing, f"MLflow run lacks declared metrics: {sorted(missing)}"
    undeclared = [k for k in run.data.metrics if not M.declared(k, K)]
    assert not undeclared, f"undeclared metrics were logged: {undeclared}"
    assert len(client.get_metric_history(mlflow_id, M.REWARD_MEAN)) == steps
    assert run.data.params["rollout.group_size"] == str(K)

    # rerun with the same command: the run is finished, so nothing trains and it says so (no green no-op)
    proc = _cli(args)
    out, _ = proc.communicate(timeout=600)
    flat = " ".join(out.split())  # rich wraps long lines
    assert proc.returncode == 0 and f"finished: run 'e2e' already finished {steps} steps: nothing trained" in flat, out
    assert "Traceback" not in out and "ExGRPO preset=" not in out  # the preflight stops it before the flow
    again = client.get_run(mlflow_id).info
    assert (again.status, again.end_time) == (run.info.status, run.info.end_time)


def test_killed_run_resumes_from_checkpoint(tmp_path, prefect_server, tiny_overrides):
    args = ["train", "--config", "configs/tiny.yaml", *sum((["--set", o] for o in tiny_overrides), []),
            "--set", "run.steps=12", "--set", "run.checkpoint_every=2", "--set", "run.name=resume"]
    proc = _cli(args, start_new_session=True)
    db = tmp_path / "exp.db"
    deadline = time.time() + 600
    while time.time() < deadline:  # wait for the checkpoint after step 4 (files: no database lock to wait on)
        ckpt = latest_checkpoint(tmp_path / "runs" / "resume")
        if ckpt is not None and int(ckpt.name.rsplit("_", 1)[1]) >= 4:
            break
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    (run_id, step_before), = _rows(db, "select id, step from runs where name='resume'")
    assert step_before < 11  # 12 steps: room for a kill that lands late on a loaded machine

    out = _run_cli(args)
    assert "resumed run" in out, out[-3000:]
    (run_id2, status, step), = _rows(db, "select id, status, step from runs where name='resume'")
    assert run_id2 == run_id and status == "finished" and step == 11
    per_step = _rows(db, "select step, count(*) from group_results where run_id=:r group by step order by step",
                     r=run_id)
    assert [s for s, _ in per_step] == list(range(12)), "a step is missing or duplicated after resume"
    assert all(n == 8 for _, n in per_step), "a step's groups were written twice or lost"
    metric_steps = _rows(db, "select distinct step from step_metrics where run_id=:r and key=:k order by step",
                         r=run_id, k=M.REWARD_MEAN)
    assert [s for s, in metric_steps] == list(range(12))

    import mlflow  # after the resume MLflow holds exactly one point per (metric, step), as the database does

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    (mlflow_id,), = _rows(db, "select mlflow_run_id from runs where id=:r", r=run_id)
    for key in client.get_run(mlflow_id).data.metrics:
        steps = [m.step for m in client.get_metric_history(mlflow_id, key)]
        assert len(steps) == len(set(steps)), f"{key}: duplicated points at steps {sorted(steps)}"
    assert sorted(m.step for m in client.get_metric_history(mlflow_id, M.REWARD_MEAN)) == list(range(1, 13))
