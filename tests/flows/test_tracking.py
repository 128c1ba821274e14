"""MLflow store handling in flows/tracking.py: several processes creating one local store at once."""

from __future__ import annotations

import multiprocessing as mp

import pytest

pytestmark = pytest.mark.slow


def _open_run(args) -> str:
    uri, barrier = args
    from exgrpo_core.config.schema import ExGRPOConfig
    from flows.tracking import MlflowRun

    cfg = ExGRPOConfig()
    cfg.run.mlflow_tracking_uri = uri
    barrier.wait()  # every process creates the (new) store at the same moment
    try:
        MlflowRun(cfg, None, tags={}).end()
        return "ok"
    except Exception as e:  # noqa: BLE001 - reported to the test
        return f"{type(e).__name__}: {e}"[:300]


def test_concurrent_starts_create_one_local_store(tmp_path):
    n = 4
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(n)
        with ctx.Pool(n) as pool:
            results = pool.map(_open_run, [(uri, barrier)] * n)
    assert results == ["ok"] * n, results
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("exgrpo")
    assert exp is not None
    assert len(client.search_runs([exp.experiment_id])) == n


def test_a_continued_run_gets_one_point_per_metric_and_step(tmp_path):
    """A resume replays the steps after its checkpoint: points already logged are not logged twice."""
    import mlflow

    from exgrpo_core.config.schema import ExGRPOConfig
    from flows.tracking import MlflowRun

    cfg = ExGRPOConfig()
    cfg.run.mlflow_tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = MlflowRun(cfg, None, tags={})
    for step in range(3):
        first.log_metrics({"a": step, "b": 10 + step}, step)
    first.log_metrics({"a": 2.0}, 3)  # killed half-way through logging step 3
    first.end("FAILED")
    again = MlflowRun(cfg, first.run_id, tags={})  # resumed from the checkpoint of step 1
    for step in range(2, 5):
        again.log_metrics({"a": 100 + step, "b": 100 + step}, step)
    again.end()
    client = mlflow.MlflowClient(tracking_uri=cfg.run.mlflow_tracking_uri)
    for key in ("a", "b"):  # MLflow steps are step numbers: index + 1
        steps = sorted(m.step for m in client.get_metric_history(first.run_id, key))
        assert steps == [1, 2, 3, 4, 5], (key, steps)
    b = {m.step: m.value for m in client.get_metric_history(first.run_id, "b")}
    assert b[3] == 12 and b[4] == 103  # the first point of a step stands; a missing one is filled in


def test_a_run_logged_before_step_numbers_keeps_its_0_based_steps_on_resume(tmp_path):
    """A run without the step-numbering tag (logged 0-based by older code) continues 0-based: a resume
    still adds exactly one point per (metric, step), none shifted beside the old ones."""
    import mlflow

    from exgrpo_core.config.schema import ExGRPOConfig
    from flows.tracking import STEP_TAG, MlflowRun

    cfg = ExGRPOConfig()
    cfg.run.mlflow_tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    old = MlflowRun(cfg, None, tags={})
    client = mlflow.MlflowClient(tracking_uri=cfg.run.mlflow_tracking_uri)
    client.delete_tag(old.run_id, STEP_TAG)  # as older code made it
    for step in range(2):
        client.log_metric(old.run_id, "a", step, step=step)
    old.end("FAILED")
    again = MlflowRun(cfg, old.run_id, tags={})
    for step in range(1, 3):
        again.log_metrics({"a": 100 + step}, step)
    again.end()
    assert {m.step: m.value for m in client.get_metric_history(old.run_id, "a")} == {0: 0, 1: 1, 2: 102}


def test_a_kill_while_mlflow_creates_its_store_leaves_no_half_built_store(tmp_path, monkeypatch):
    """The process dies while MLflow's migrations create the store: the next start must still open it
    (a half-built store failed every later start with 'table trace_info already exists')."""
    import mlflow.store.db.utils as db_utils

    from exgrpo_core.config.schema import ExGRPOConfig
    from flows.tracking import MlflowRun

    class Killed(BaseException):
        pass

    def die(engine):  # a migration's DDL half done (SQLite keeps it), then the kill
        with engine.begin() as c:
            c.exec_driver_sql("CREATE TABLE trace_info (request_id VARCHAR(50) PRIMARY KEY)")
        raise Killed()

    cfg = ExGRPOConfig()
    cfg.run.mlflow_tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with monkeypatch.context() as m:
        m.setattr(db_utils, "_upgrade_db", die)
        try:
            MlflowRun(cfg, None, tags={})
        except Killed:
            pass
        else:
            raise AssertionError("the simulated kill did not happen")
    run = MlflowRun(cfg, None, tags={})
    run.log_metrics({"a": 1.0}, 0)
    run.end("FINISHED")
    assert (tmp_path / "mlflow.db").exists()


def test_experiments_are_marked_model_training_new_or_existing_but_a_users_kind_stays(tmp_path):
    """MLflow 3 opens an unmarked experiment in its GenAI view: ours say `custom_model_development`."""
    import mlflow

    from exgrpo_core.config.schema import ExGRPOConfig
    from flows.tracking import EXPERIMENT_KIND_TAG, MlflowRun

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    kinds = {}
    for name, existing in (("new", None), ("old", {}), ("genai", {EXPERIMENT_KIND_TAG: "genai_development"})):
        cfg = ExGRPOConfig()
        cfg.run.mlflow_tracking_uri, cfg.run.mlflow_experiment = uri, name
        if existing is not None:  # made before (by an older version, or by the user)
            mlflow.MlflowClient(uri).create_experiment(name, artifact_location=(tmp_path / name).as_uri(),
                                                       tags=existing)
        run = MlflowRun(cfg, None, tags={})
        run.end()
        assert run.experiment_url.endswith(f"/#/experiments/{run.experiment_id}?workflowType=machine_learning")
        kinds[name] = mlflow.MlflowClient(uri).get_experiment_by_name(name).tags.get(EXPERIMENT_KIND_TAG)
    assert kinds == {"new": "custom_model_development", "old": "custom_model_development",
                     "genai": "genai_development"}
