"""Two training processes (`torchrun --nproc_per_node 2`, gloo on CPU) of the tiny preset, end to end,
with the weights replicated (DDP-style) and sharded (FSDP2; checkpoints with weight shards, and
gathered on rank 0).

Rank 0 runs the Prefect flow (real server), the database and MLflow; rank 1 follows. Checks: the run
trains with replay and retirement, both processes hold the same weights after every step, evaluation
is sampled by both processes, MLflow gets the declared metrics; and a run stopped after 3 steps and resumed from its checkpoint writes exactly
the trajectories and metrics of an uninterrupted 6-step run.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_helpers import sqlite_rows as _rows
import torch

from exgrpo_core import metrics as M
from exgrpo_core.models.load import load_policy
from exgrpo_core.run.checkpoint import latest_checkpoint

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
TINY = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "intermediate_size": 128}


def _torchrun(tmp_path: Path, overrides: list[str], name: str, steps: int) -> str:
    sets = [*overrides, f"run.name={name}", f"run.steps={steps}", "run.checkpoint_every=2", "eval.every=3",
            "eval.suites=[bundled:tiny-arith]", "eval.max_questions=24", "eval.samples=2"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "flows.cli", "train", "--config", "configs/tiny.yaml", *sum((["--set", s] for s in sets), [])]
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                          text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    return out


def _trajectories(db: Path, name: str):
    return _rows(db, "select q.uid, t.step, t.token_ids, t.reward, t.in_pool, t.times_replayed "
                     "from trajectories t join question_states q on q.question_id = t.question_id "
                     "and q.run_id = t.run_id join runs r on r.id = t.run_id where r.name = :n "
                     "order by t.step, q.uid, t.token_ids", n=name)


def _metrics(db: Path, name: str) -> dict[tuple[int, str], float]:
    rows = _rows(db, "select m.step, m.key, m.value from step_metrics m join runs r on r.id = m.run_id "
                     "where r.name = :n", n=name)
    return {(s, k): v for s, k, v in rows if not k.startswith("perf/") and "seconds" not in k and "_per_s" not in k}


def _evals(db: Path, name: str):
    return _rows(db, "select e.step, e.benchmark, e.metric, e.value, e.n from eval_results e join runs r "
                     "on r.id = e.run_id where r.name = :n and e.metric not like '%seconds%' "
                     "order by e.step, e.benchmark, e.metric", n=name)


@pytest.mark.parametrize("sharding", ["replicate", "fsdp2"])
def test_two_processes_train_and_resume_exactly(tmp_path, prefect_server, tiny_overrides, sharding):
    db = tmp_path / "exp.db"
    tiny_overrides = [*tiny_overrides, f"train.sharding={sharding}"]
    if sharding == "fsdp2":  # every process writes its weight shard (gathered checkpoints: the end of this test)
        tiny_overrides.append("run.checkpoint_weights=sharded")
    out = _torchrun(tmp_path, tiny_overrides, "mp", 6)
    assert "step    6/6" in out, out[-3000:]
    (run_id, status, step, mlflow_id), = _rows(db, "select id, status, step, mlflow_run_id from runs where name='mp'")
    assert status == "finished" and step == 5

    gaps = _rows(db, "select step, value from step_metrics where run_id=:r and key=:k order by step",
                 r=run_id, k=M.DIST_PARAM_GAP)
    if sharding == "replicate":  # FSDP2 shards differ by design: nothing to compare
        assert [s for s, _ in gaps] == list(range(6)), "the weight check between processes did not run every step"
        assert all(v == 0.0 for _, v in gaps), f"processes drifted apart: {gaps}"
    sums = dict(_rows(db, "select key, sum(value) from step_metrics where run_id=:r group by key", r=run_id))
    assert sums[M.REPLAYED_SAMPLES] > 0 and sums[M.REPLAY_TOKENS] > 0, "no replayed sample was trained on"
    assert sums[M.RESPONSES] + sums[M.REPLAYED_SAMPLES] <= 6 * 64

    evals = _evals(db, "mp")  # evaluation sampled by both processes (team.engine_view) at steps 2 and 5
    assert {e[0] for e in evals} == {2, 5} and any(e[2] == "pass@1" for e in evals)
    assert {e[4] for e in evals if e[1] != "average"} == {24}

    ckpt = latest_checkpoint(tmp_path / "runs" / "mp")
    optimizer = torch.load(ckpt / "trainer_state.pt", weights_only=False)["optimizer"]
    if sharding == "fsdp2":  # each process wrote its optimiser and weight shards
        assert optimizer is None and len(list((ckpt / "optimizer").glob("*.distcp"))) == 2
        assert len(list((ckpt / "model").glob("*.distcp"))) == 2 and not list(ckpt.glob("*.safetensors"))
    else:
        assert optimizer["state"], "the replicated optimiser state is saved whole"
    init, _ = load_policy("tiny", tiny=TINY, seed=0)
    final, _ = load_policy(str(ckpt))
    moved = [n for n, p in init.state_dict().items() if not torch.equal(p, final.state_dict()[n])]
    assert len(moved) > len(init.state_dict()) * 3 / 4, "the two-process run did not update the weights"

    import mlflow

    run = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(mlflow_id)
    assert (M.DIST_PARAM_GAP in run.data.metrics) == (sharding == "replicate") and M.REWARD_MEAN in run.data.metrics
    assert not [k for k in run.data.metrics if not M.declared(k, 8)]

    # stop after 3 steps, resume to 6: the same experience and metrics as the uninterrupted run
    _torchrun(tmp_path, tiny_overrides, "mp-resumed", 3)
    out = _torchrun(tmp_path, tiny_overrides, "mp-resumed", 6)
    assert "resumed run" in out, out[-3000:]
    (status, step, mlflow_resumed), = _rows(db, "select status, step, mlflow_run_id from runs where name='mp-resumed'")
    assert status == "finished" and step == 5
    a, b = _trajectories(db, "mp"), _trajectories(db, "mp-resumed")
    assert a and a == b, "the resumed two-process run stored different trajectories"
    ma, mb = _metrics(db, "mp"), _metrics(db, "mp-resumed")
    assert ma.keys() == mb.keys()
    diff = {k: (ma[k], mb[k]) for k in ma if not math.isclose(ma[k], mb[k], rel_tol=1e-6, abs_tol=1e-9)}
    assert not diff, f"metrics differ after resume: {sorted(diff.items())[:8]}"
    assert _evals(db, "mp-resumed") == evals, "the resumed run evaluated differently"
    history = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}").get_metric_history(
        mlflow_resumed, M.REWARD_MEAN)
    assert sorted(m.step for m in history) == list(range(1, 7)), "the resumed run did not continue its MLflow run"

    if sharding == "replicate":  # a replicated checkpoint (whole optimiser state) resumed with FSDP2,
        out = _torchrun(tmp_path, [*tiny_overrides, "train.sharding=fsdp2"], "mp", 8)  # weights gathered
        assert "resumed run" in out, out[-3000:]
        (status, step), = _rows(db, "select status, step from runs where name='mp'")
        assert status == "finished" and step == 7
        ckpt = latest_checkpoint(tmp_path / "runs" / "mp")
        assert ckpt.name == "step_000008" and (ckpt / "optimizer").is_dir() and list(ckpt.glob("*.safetensors"))
