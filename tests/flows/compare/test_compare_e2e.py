"""End to end: `exgrpo compare` of two arms on the tiny preset through a real Prefect server.

Checks the nested MLflow runs, the equal B*K rollout slots per step counted from the database's group
results and replays, and that the table holds the children's stored metrics and evaluations; then a
rerun with the same name resumes the same runs instead of duplicating them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_helpers import sqlite_rows as _rows

from exgrpo_core import metrics as M

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]
STEPS, B, K = 3, 8, 8


def _compare(tiny_overrides, name: str) -> str:
    sets = [*tiny_overrides, f"run.steps={STEPS}", "eval.suites=[bundled:tiny-arith]", "eval.max_questions=8"]
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "compare", "--config", "tiny", "--arms", "on_policy,exgrpo",
                           "--name", name, *sum((["--set", s] for s in sets), [])],
                          cwd=ROOT, env=dict(os.environ), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc.stdout


def test_compare_two_arms_nested_runs_equal_budget_and_table(tmp_path, prefect_server, tiny_overrides):
    _compare(tiny_overrides, "cmp")
    db = tmp_path / "exp.db"
    runs = dict(_rows(db, "select name, id from runs where name like 'cmp-%'"))
    assert set(runs) == {"cmp-on_policy-s0", "cmp-exgrpo-s0"}

    # MLflow: one parent run holding the table, the two children nested under it
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("exgrpo")
    parents = client.search_runs([exp.experiment_id], "tags.`exgrpo.comparison` = 'cmp'")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    parent = parents[0].info.run_id
    children = client.search_runs([exp.experiment_id], f"tags.`mlflow.parentRunId` = '{parent}'")
    assert sorted(c.info.run_name for c in children) == ["cmp-exgrpo-s0", "cmp-on_policy-s0"]
    assert {c.data.params["buffer.replay_ratio"] for c in children} == {"0.0", "0.5"}
    artifacts = {a.path for a in client.list_artifacts(parent)}
    assert {"compare_cmp.md", "compare_cmp.csv", "compare_cmp.json", "compare_cmp_reward.png",
            "compare_cmp_buffer.png", "compare_cmp_retired.png"} <= artifacts
    doc = json.loads(Path(client.download_artifacts(parent, "compare_cmp.json", str(tmp_path))).read_text())
    rows = {r["arm"]: r for r in doc["rows"]}

    for arm, run_id in (("on_policy", runs["cmp-on_policy-s0"]), ("exgrpo", runs["cmp-exgrpo-s0"])):
        # the budget, counted from the database rather than from the logged metrics
        groups = dict((s, (n, rep)) for s, n, rep in _rows(
            db, "select step, sum(n), sum(is_replay) from group_results where run_id=:r group by step", r=run_id))
        replays = dict(_rows(db, "select step, count(*) from replays where run_id=:r group by step", r=run_id))
        assert sorted(groups) == list(range(STEPS))
        metrics = {(k, s): v for k, s, v in _rows(db, "select key, step, value from step_metrics where run_id=:r",
                                                  r=run_id)}
        for step, (slots, replay_groups) in groups.items():
            generated = slots - replay_groups  # K-1 new rollouts in each experiential group
            assert slots == B * K and metrics[M.RESPONSES, step] == generated
            # a replay slot stays empty only when its question was solved K/K (retired) in that step
            assert replays.get(step, 0) == metrics[M.REPLAYED_SAMPLES, step] <= replay_groups
        if arm == "on_policy":
            assert all(rep == 0 for _, rep in groups.values())
        # the table row is what the child stored
        row, last = rows[arm], STEPS - 1
        assert row["run_id"] == run_id and row["steps"] == STEPS and row["slots_per_step"] == B * K and row["slots_ok"]
        assert row["final_reward"] == metrics[M.REWARD_MEAN, last]
        assert row["final_fresh_pass1"] == metrics[M.FRESH_PASS1, last]
        assert row["responses_generated"] == sum(n - rep for n, rep in groups.values())
        assert row["replayed"] == sum(replays.values())
        assert row["unfilled"] == sum(rep for _, rep in groups.values()) - row["replayed"]
        assert (row["buffer_questions"], row["retired"]) == (metrics[M.BUFFER_QUESTIONS, last],
                                                             metrics[M.RETIRED_QUESTIONS, last])
        evals = dict(_rows(db, "select benchmark, value from eval_results where run_id=:r and metric='pass@1' "
                               "and step=(select max(step) from eval_results where run_id=:r)", r=run_id))
        assert evals and row["heldout_avg"] == evals.pop("average") and row["heldout"] == evals
        assert any(c.info.run_id == row["mlflow_run_id"] for c in children)
    assert rows["on_policy"]["paper_id_avg"] == 45.3 and rows["exgrpo"]["paper_id_avg"] == 48.3
    assert rows["exgrpo"]["replayed"] > 0, "the ExGRPO arm never replayed in 3 tiny steps"

    # a rerun with the same name resumes: no new runs in the database or in MLflow
    _compare(tiny_overrides, "cmp")
    assert len(_rows(db, "select id from runs where name like 'cmp-%'")) == 2
    assert len(client.search_runs([exp.experiment_id], "tags.`exgrpo.comparison` = 'cmp'")) == 1
    assert len(client.search_runs([exp.experiment_id], f"tags.`mlflow.parentRunId` = '{parent}'")) == 2
