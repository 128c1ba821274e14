"""`exgrpo train` on a reward of the user's: a shipped continuous reward function trains through Prefect
and every trajectory records it; an unusable function or a silent reward server is one line before
Prefect starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import select

from exgrpo_core.store.experience_store import ExperienceStore
from exgrpo_core.store.tables import Trajectory

ROOT = Path(__file__).resolve().parents[2]


def _train(sets: list[str], env: dict) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "flows.cli", "train", "--config", "tiny"]
    for s in sets:
        args += ["--set", s]
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=900, env={**os.environ, **env})


@pytest.mark.slow
def test_a_continuous_reward_function_trains_through_prefect(tmp_path, prefect_server, tiny_overrides):
    proc = _train([*tiny_overrides, "run.name=own-reward", "run.steps=2", "reward.fn=arith_format",
                   "buffer.start_threshold=0"], {"PREFECT_API_URL": prefect_server})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    with ExperienceStore(f"sqlite:///{tmp_path / 'exp.db'}") as store:
        run_id = store.find_run_by_name("own-reward")
        row = store.get_run(run_id)
        with store.engine.connect() as conn:
            trajs = conn.execute(select(Trajectory.reward, Trajectory.verifier, Trajectory.verifier_version,
                                        Trajectory.in_pool).where(Trajectory.run_id == run_id)).all()
        metrics = store.get_metrics(run_id, ["verify/errors", "rollout/reward_mean"])
    assert row["status"] == "finished" and row["config"]["reward"]["fn"] == "arith_format"
    assert {t.verifier for t in trajs} == {"reward_fn"}
    assert {t.verifier_version for t in trajs} == {f"arith_format@{trajs[0].verifier_version.split('@')[1]}"}
    assert any(0 < t.reward < 1 for t in trajs) and all(0 <= t.reward <= 1 for t in trajs)
    assert [v for _, v in metrics["verify/errors"]] == [0.0, 0.0]
    assert len(metrics["rollout/reward_mean"]) == 2


@pytest.mark.parametrize("sets, words", [
    (["reward.fn=no_such_reward"], "reward.fn='no_such_reward' is neither package.module:callable"),
    (["reward.fn=exgrpo_core.reward.examples:absent"], "has no attribute 'absent'"),
    (["reward.url=http://user:pw@127.0.0.1:9/score", "reward.url_retries=0"],
     "reward server http://user:***@127.0.0.1:9/score did not answer after 1 tries"),
    (["reward.fn=exact_match", "reward.url=http://127.0.0.1:9"], "reward.fn and reward.url are two reward sources"),
])
def test_an_unusable_reward_is_one_line_before_prefect(tmp_path, tiny_overrides, sets, words):
    proc = _train([*tiny_overrides, "run.name=bad-reward", *sets],
                  {"PREFECT_API_URL": "http://127.0.0.1:9/api", "PREFECT_HOME": str(tmp_path / "ph")})
    out = proc.stdout + proc.stderr
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in out, out[-3000:]
    assert words in out and "pw@" not in out
    assert not (tmp_path / "runs" / "bad-reward").exists()
