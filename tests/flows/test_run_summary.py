"""The end of `exgrpo train` says what the run found and how to look at it: the final evaluation per suite
beside step 0, the replay pool and retired set, the wall time, the MLflow / dashboard commands and the
Prefect flow run's page; the summary artifact holds the same lines. A real 3-step tiny run through the CLI
against a Prefect server, every number checked against the database and MLflow."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from exgrpo_core import metrics as M
from exgrpo_core.config.schema import ExGRPOConfig
from exgrpo_core.store.experience_store import ExperienceStore
from flows import cli
from flows.run_report import eval_lines, look_commands, summary_lines

ROOT = Path(__file__).resolve().parents[2]
EVAL = ["eval.final=true", "eval.at_start=true", "eval.suites=[bundled:tiny-arith]", "eval.max_questions=6",
        "eval.samples=2", "eval.pass_k=[2]", "eval.max_response_tokens=1", "eval.batch_size=4"]


def _pct(v: float) -> str:
    return f"{100 * v:.1f}%"


@pytest.mark.slow
def test_the_last_lines_say_what_the_run_found_and_how_to_look_at_it(tmp_path, prefect_server, tiny_overrides):
    args = [sys.executable, "-m", "flows.cli", "train", "--config", "tiny"]
    for o in [*tiny_overrides, "run.name=summary", "run.steps=3", *EVAL]:
        args += ["--set", o]
    t0 = time.perf_counter()
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PREFECT_API_URL": prefect_server})
    took = time.perf_counter() - t0
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    out = proc.stdout.splitlines()
    start = next(i for i, line in enumerate(out) if line.startswith("done: "))
    lines = out[start:]
    done = re.fullmatch(r"done: run ([0-9a-f]{32}) \(3 steps\), MLflow run ([0-9a-f]{32}), run dir (.+)", lines[0])
    assert done, lines[0]
    run_id, mlflow_id, run_dir = done.groups()
    assert Path(run_dir) == tmp_path / "runs" / "summary"
    db_url, mlflow_uri = f"sqlite:///{tmp_path / 'exp.db'}", f"sqlite:///{tmp_path / 'mlflow.db'}"

    # the final evaluation (step 3) beside the starting policy's (step 0), as the database holds them
    with ExperienceStore(db_url) as store:
        evals = {(r["step"], r["benchmark"]): r["metrics"] for r in store.get_evals(run_id)}
    final, first = evals[(2, "tiny-arith")], evals[(-1, "tiny-arith")]
    assert lines[1] == (f"final eval at step 3: tiny-arith (6 questions x 2 samples) pass@1 {_pct(final['pass@1'])} "
                        f"(step 0: {_pct(first['pass@1'])}), pass@2 {_pct(final['pass@2'])} "
                        f"(step 0: {_pct(first['pass@2'])})")
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=mlflow_uri)
    history = {m.step: m.value for m in client.get_metric_history(mlflow_id, M.eval_key("tiny-arith", "pass@1"))}
    assert history == {0: first["pass@1"], 3: final["pass@1"]}

    # the pool and retired set after the last step, as MLflow logged them at step 3
    last = {k: int(client.get_metric_history(mlflow_id, f"buffer/{k}")[-1].value)
            for k in ("questions", "trajectories", "retired_questions")}
    pool = re.fullmatch(r"replay pool: (\d+) questions? / (\d+) trajector(?:y|ies); retired: (\d+) questions?",
                        lines[2])
    assert pool and [int(x) for x in pool.groups()] == list(last.values()), (lines[2], last)

    wall = re.fullmatch(r"wall time: (\d+) s in the training flow \((\d+) s with the command's start\)", lines[3])
    assert wall and 0 < int(wall[1]) <= int(wall[2]) <= took + 1, lines[3]

    # MLflow: a command that opens this store, and the run's page on the address `mlflow ui` serves
    command, _, url = lines[4].removeprefix("MLflow:").strip().partition("  # then open ")
    assert shlex.split(command) == ["mlflow", "ui", "--backend-store-uri", mlflow_uri]
    assert (Path(sys.executable).parent / "mlflow").is_file()
    run = client.get_run(mlflow_id)
    assert url == (f"http://127.0.0.1:5000/#/experiments/{run.info.experiment_id}/runs/{mlflow_id}"
                   "?workflowType=machine_learning")

    # dashboard: the command parses as `exgrpo dashboard` on this database and MLflow store, the page shows the run
    command, _, url = lines[5].removeprefix("dashboard:").strip().partition("  # then open ")
    argv = shlex.split(command)
    assert argv[0] == "exgrpo" and (Path(sys.executable).parent / "exgrpo").is_file()
    parsed = cli.build_parser().parse_args(argv[1:])
    assert parsed.fn is cli.cmd_dashboard and parsed.mlflow_uri == mlflow_uri
    assert cli.dashboard_db_url(parsed.db_url, ExGRPOConfig()) == (db_url, "--db-url")
    with ExperienceStore(parsed.db_url) as store:
        assert store.get_run(run_id)["status"] == "finished"
    assert url == f"http://127.0.0.1:8501/?run={run_id}"

    # Prefect: the flow run's page on the server
    flow_run_id = run.data.tags["prefect.flow_run_id"]
    assert lines[6] == f"Prefect:   {prefect_server.removesuffix('/api')}/runs/flow-run/{flow_run_id}"
    assert len(lines) == 7, lines

    # the summary artifact holds the same lines (its wall time without the command's start)
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter

    with get_client(sync_client=True) as pc:
        (md,) = [a for a in pc.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id={"any_": [flow_run_id]}))
                 if a.type == "markdown"]
    for line in lines:
        assert (line.split(" (")[0] if line.startswith("wall time") else line) in md.data, line
    assert f"| final evaluation | tiny-arith (6 questions x 2 samples) pass@1 {_pct(final['pass@1'])}" in md.data


def test_several_suites_get_a_line_each_and_the_averages():
    final = {"AIME24": {"pass@1": 0.25, "pass@8": 0.5, "questions": 30, "samples": 8},
             "ARC-c": {"pass@1": 0.75, "questions": 10, "samples": 1}, "average": {"pass@1": 0.5}}
    start = {"AIME24": {"pass@1": 0.125}, "average": {"pass@1": 0.3}}
    assert eval_lines(final, start, 50) == [
        "final eval at step 50: AIME24 (30 questions x 8 samples) pass@1 25.0% (step 0: 12.5%), pass@8 50.0%",
        "final eval at step 50: ARC-c (10 questions x 1 sample) pass@1 75.0%",
        "final eval at step 50: id average pass@1 25.0% (step 0: 12.5%)",
        "final eval at step 50: ood average pass@1 75.0%",
        "final eval at step 50: average pass@1 50.0% (step 0: 30.0%)"]
    assert eval_lines(None, None, 4) == [
        "final evaluation: off (--set eval.final=true evaluates the suites after the last step)"]


def test_urls_with_passwords_are_masked_and_the_ephemeral_api_gets_no_prefect_line():
    look = look_commands(tracker_uri="https://bob:s3cret@mlflow.example/", db_url="postgresql+psycopg://"
                         "trainer:pw@db:5432/exgrpo", mlflow_url="https://bob:s3cret@mlflow.example/#/x", run_id="r1")
    assert "s3cret" not in str(look) and ":pw@" not in str(look)
    assert look["mlflow"] == "open https://bob:***@mlflow.example/#/x"
    assert look["dashboard"].startswith("exgrpo dashboard --db-url 'postgresql+psycopg://trainer:***@db:5432/exgrpo'")
    summary = {"run_id": "r1", "mlflow_run_id": "m1", "run_dir": "/runs/x", "steps": 4, "first_step": 2,
               "wall_s": 125.0, "pool": {"questions": 1, "trajectories": 1, "retired": 0},
               "look": {**look, "prefect": "http://prefect:4200/runs/flow-run/f1"}}
    lines = summary_lines(summary, prefect=False)
    assert "replay pool: 1 question / 1 trajectory; retired: 0 questions" in lines
    assert "wall time: 2 m 05 s in the training flow (this session: steps 3-4)" in lines
    assert not [x for x in lines if x.startswith("Prefect")]
    assert summary_lines(summary)[-1] == "Prefect:   http://prefect:4200/runs/flow-run/f1"


def test_the_dashboard_fills_a_masked_password_from_the_environment(monkeypatch):
    monkeypatch.setenv("EXGRPO_DB_URL", "postgresql+psycopg://trainer:pw@db:5432/exgrpo")
    url, _ = cli.dashboard_db_url("postgresql+psycopg://trainer:***@db:5432/exgrpo", ExGRPOConfig())
    assert url == "postgresql+psycopg://trainer:pw@db:5432/exgrpo"


def test_the_summary_artifact_gives_the_checkpoint_hash_a_row_of_its_own(monkeypatch):
    from types import SimpleNamespace

    from flows import run_report

    shown = []
    monkeypatch.setattr(run_report, "create_markdown_artifact", lambda text, **kw: shown.append(text))
    sha = "ab" * 32
    tracker = SimpleNamespace(run_url="http://m/r", experiment_url="http://m/e", uri="http://m")
    cfg = ExGRPOConfig()
    summary = {"run_id": "r1", "mlflow_run_id": "m1", "run_dir": "/runs/x", "steps": cfg.run.steps}
    run_report.FlowRunReport("x", cfg.run.steps).summary(
        summary=summary, cfg=cfg, tracker=tracker, pictures=None,
        checkpoint={"path": "/runs/a-long-run-name/checkpoints/step_000009", "manifest_sha256": sha})
    rows = [line for line in shown[0].splitlines() if line.startswith("| ")]
    assert "| checkpoint | `/runs/a-long-run-name/checkpoints/step_000009` |" in rows
    assert f"| checkpoint manifest SHA-256 | `{sha}` |" in rows  # the whole hash, in a cell of its own
