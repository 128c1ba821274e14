"""Every way a run ends leaves one run with a true status (issue 16, item 2): killed before its first
checkpoint and restarted (the same run id continues), failed at start-up, cancelled through Prefect."""

from __future__ import annotations

import types

import pytest
from e2e_helpers import sqlite_rows

from exgrpo_core.config.load import load_config
from exgrpo_core.run.session import open_session

pytestmark = pytest.mark.slow


def _never(texts, answers):
    return [(0.0, "wrong")] * len(texts)


def _overrides(tmp_path, *extra):
    return [f"run.output_dir={tmp_path / 'runs'}", f"run.db_url=sqlite:///{tmp_path / 'exp.db'}",
            f"run.mlflow_tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}", "run.name=r", *extra]


def test_a_run_killed_before_its_first_checkpoint_is_continued_not_minted_again(tmp_path):
    cfg = load_config("tiny", _overrides(tmp_path))
    s = open_session(cfg, verify=_never)
    first = s.run_id
    s.store.log_metrics(first, 0, {"x": 1.0})  # work of step 0, never checkpointed
    s.store.update_run(first, step=0)
    s.close()  # as if killed: status stays 'running', no checkpoint
    s2 = open_session(cfg, verify=_never)
    try:
        assert s2.run_id == first and s2.step == 0
    finally:
        s2.close()
    rows = sqlite_rows(tmp_path / "exp.db", "select id, step from runs where name='r'")
    assert rows == [(first, -1)]
    assert sqlite_rows(tmp_path / "exp.db", "select count(*) from step_metrics")[0][0] == 0


def test_a_failure_between_the_session_and_the_loop_marks_the_run_failed(tmp_path, prefect_server,
                                                                         monkeypatch):
    from flows import train as train_flow

    def broken(*a, **k):
        raise RuntimeError("MLflow start-up failed")

    monkeypatch.setattr(train_flow, "MlflowRun", broken)
    with pytest.raises(RuntimeError, match="MLflow start-up failed"):
        train_flow.train(preset="tiny", overrides=_overrides(tmp_path, "run.steps=1"))
    assert sqlite_rows(tmp_path / "exp.db", "select status from runs where name='r'") == [("failed",)]


def test_a_cancelled_flow_whose_process_is_gone_is_recorded_killed(tmp_path):
    import mlflow

    from flows.tracking import MlflowRun

    cfg = load_config("tiny", _overrides(tmp_path))
    s = open_session(cfg, verify=_never)
    tracker = MlflowRun(cfg, None, tags={})
    s.store.update_run(s.run_id, mlflow_run_id=tracker.run_id)
    s.close()  # the process the runner stopped; its MLflow run still says RUNNING
    from flows.train import _mark_ended_elsewhere

    run = types.SimpleNamespace(parameters={"preset": "tiny", "overrides": _overrides(tmp_path)})
    _mark_ended_elsewhere(None, run, None)
    assert sqlite_rows(tmp_path / "exp.db", "select status from runs where name='r'") == [("killed",)]
    status = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(tracker.run_id).info.status
    assert status == "KILLED"
