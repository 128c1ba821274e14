"""Evaluation through the real flows: periodic + final evaluation inside a tiny training run (DB, MLflow
metrics and artifacts, no duplicate rows on resume), `exgrpo evaluate` on its checkpoint in a subprocess
(attached to the run's ids) and on a bare model, and a bad suite path as a clear exit-2 error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from exgrpo_core import metrics as M
from exgrpo_core.store.experience_store import ExperienceStore

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
EVAL = ["eval.suites=[bundled:tiny-arith]", "eval.max_questions=6", "eval.samples=2",
        "eval.max_response_tokens=1", "eval.pass_k=[2]"]


def _cli(*args):
    proc = subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=ROOT, env=dict(os.environ),
                          capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


def _sets(overrides):
    return sum((["--set", o] for o in overrides), [])


@pytest.fixture(scope="module")
def trained(tmp_path_factory, prefect_server):
    """A 4-step tiny run with eval.every=2 and eval.final=true, then resumed to 6 steps."""
    from flows.train import train

    tmp = tmp_path_factory.mktemp("evalrun")
    overrides = [f"run.output_dir={tmp / 'runs'}", f"run.db_url=sqlite:///{tmp / 'exp.db'}",
                 f"run.mlflow_tracking_uri=sqlite:///{tmp / 'mlflow.db'}", "run.name=ev", "run.steps=4",
                 "run.checkpoint_every=2", "eval.every=2", "eval.final=true", *EVAL]
    first = train(preset="tiny", overrides=overrides)
    again = train(preset="tiny", overrides=overrides, return_state=True)  # already complete: nothing runs
    longer = train(preset="tiny", overrides=overrides + ["run.steps=6"])  # resumes after step 3
    return tmp, overrides, first, again, longer


def test_training_run_evaluates_periodically_and_at_the_end(trained):
    tmp, _, first, again, longer = trained
    ev = first["eval"]
    assert set(ev) == {"tiny-arith", "average"}
    m = ev["tiny-arith"]
    assert m["questions"] == 6 and m["samples"] == 2 and 0 <= m["pass@1"] <= m["pass@2"] <= 1
    assert ev["average"]["pass@1"] == pytest.approx(m["pass@1"])
    assert again.is_cancelled() and "already finished 4 steps" in again.message  # no second final eval

    with ExperienceStore(f"sqlite:///{tmp / 'exp.db'}") as store:
        evals = store.get_evals(first["run_id"])
        metric_steps = [s for s, _ in store.get_metrics(first["run_id"])[M.eval_key("tiny-arith", "pass@1")]]
    # every=2 -> after steps 2, 4, 6 (stored 0-based: 1, 3, 5); the final evals reuse them; no duplicates on resume
    assert [(e["step"], e["benchmark"]) for e in evals] == [
        (1, "average"), (1, "tiny-arith"), (3, "average"), (3, "tiny-arith"), (5, "average"), (5, "tiny-arith")]
    assert metric_steps == [1, 3, 5]
    by_step = {e["step"]: e["metrics"] for e in evals if e["benchmark"] == "tiny-arith"}
    assert by_step[3] == pytest.approx(ev["tiny-arith"]) and by_step[5] == pytest.approx(longer["eval"]["tiny-arith"])


def test_eval_metrics_and_artifacts_reach_mlflow_and_are_declared(trained):
    import mlflow

    tmp, _, first, _, _ = trained
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp / 'mlflow.db'}")
    run = client.get_run(first["mlflow_run_id"])
    key = M.eval_key("tiny-arith", "pass@1")
    assert [h.step for h in client.get_metric_history(run.info.run_id, key)] == [2, 4, 6]  # step numbers
    for k in (M.eval_key("average", "pass@1"), M.eval_key("tiny-arith", "pass@2"), M.EVAL_QUESTIONS_PER_S):
        assert k in run.data.metrics
    assert not [k for k in run.data.metrics if not M.declared(k, 8)]
    files = {f.path for f in client.list_artifacts(run.info.run_id, "eval/step_000004")}
    assert {f"eval/step_000004/eval_table.{x}" for x in ("md", "csv", "json", "png")} <= files
    assert "eval/step_000004/samples.jsonl" in files


def test_cli_evaluates_a_runs_checkpoint_into_that_run(trained):
    import mlflow

    tmp, overrides, first, _, _ = trained
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp / 'mlflow.db'}")
    before = client.get_run(first["mlflow_run_id"]).info
    out_dir = tmp / "table"
    rc, out = _cli("evaluate", "--config", "tiny", *_sets(overrides), "--run", "ev", "--out", str(out_dir))
    assert rc == 0, out[-3000:]
    after = client.get_run(first["mlflow_run_id"])
    assert (after.info.status, after.info.end_time) == ("FINISHED", before.end_time), "evaluate reopened the run"
    assert after.info.end_time - after.info.start_time == before.end_time - before.start_time  # its duration
    assert after.data.tags["exgrpo.kind"] == "train"
    files = {f.path for f in client.list_artifacts(after.info.run_id, "eval/step_000006")}
    assert "eval/step_000006/eval_table.md" in files
    assert "step_000006 (step 6): run" in " ".join(out.split())  # rich wraps long lines
    assert "| ev |" in out
    with ExperienceStore(f"sqlite:///{tmp / 'exp.db'}") as store:
        steps = [e["step"] for e in store.get_evals(first["run_id"]) if e["benchmark"] == "tiny-arith"]
    assert steps == [1, 3, 5], "the checkpoint's step (index 5) was evaluated again in place, not added"
    table = json.loads((out_dir / "eval_table.json").read_text())
    assert set(table["ev"]) == {"tiny-arith", "average"}


def test_cli_evaluates_a_bare_model_in_an_evaluation_only_run(tmp_path, tiny_overrides, prefect_server):
    rc, out = _cli("evaluate", "--config", "tiny", *_sets(tiny_overrides + EVAL), "--model", "tiny",
                   "--out", str(tmp_path / "t"))
    assert rc == 0, out[-3000:]
    with ExperienceStore(f"sqlite:///{tmp_path / 'exp.db'}") as store:
        run_id = store.find_run_by_name("eval-tiny")
        assert run_id and store.get_run(run_id)["mlflow_run_id"]
        assert {e["benchmark"] for e in store.get_evals(run_id)} == {"tiny-arith", "average"}
        assert {e["step"] for e in store.get_evals(run_id)} == {-1} and store.get_run(run_id)["step"] == -1
    assert "(step 0): run" in " ".join(out.split())  # the start model: no update done


def test_cli_bad_suite_path_is_one_clear_error(tmp_path, tiny_overrides):
    rc, out = _cli("evaluate", "--config", "tiny", *_sets(tiny_overrides), "--suite", str(tmp_path / "nope.parquet"))
    assert rc == 2, out[-3000:]
    flat = " ".join(out.split())  # rich wraps long lines
    assert f"error: {tmp_path / 'nope.parquet'}: file not found" in flat and "Traceback" not in out
