"""MLflow store handling in flows/tracking.py: several processes creating one local store at once."""

from __future__ import annotations

import multiprocessing as mp

import pytest

pytestmark = pytest.mark.slow


def _open_run(args) -> str:
    uri, barrier = args
    from exgrpo_core.config import ExGRPOConfig
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
