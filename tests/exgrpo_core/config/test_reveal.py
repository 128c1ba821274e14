"""Masked credentials in Prefect parameters are filled back in from the environment (issue 35, item 5):
what a comparison child or a Retry of a form run reads back is `user:***@host`, and the run connects with
the password of the worker's EXGRPO_DB_URL (same database) or, failing that, without one (libpq's pass file)."""

from __future__ import annotations

from exgrpo_core.config.load import load_config
from exgrpo_core.config.redact import hide_overrides, reveal, reveal_url
from exgrpo_core.store.engine import resolve_db_url

URL = "postgresql+psycopg://trainer:***@db.internal:5432/exgrpo_experience"


def test_a_masked_password_comes_from_the_same_database_in_the_environment(monkeypatch):
    monkeypatch.setenv("EXGRPO_DB_URL", "postgresql://trainer:p%40ss@db.internal:5432/exgrpo_experience")
    want = "postgresql+psycopg://trainer:p%40ss@db.internal:5432/exgrpo_experience"
    assert reveal_url(URL, "EXGRPO_DB_URL") == want
    assert resolve_db_url(URL, "/tmp/run") == want  # every reader of run.db_url goes through here
    for other in ("postgresql://someone:x@db.internal:5432/exgrpo_experience",  # another user
                  "postgresql://trainer:x@db.internal:5432/other",
                  "postgresql://trainer:x@elsewhere:5432/exgrpo_experience",
                  "postgresql://trainer@db.internal:5432/exgrpo_experience"):  # no password to take
        monkeypatch.setenv("EXGRPO_DB_URL", other)
        assert reveal_url(URL, "EXGRPO_DB_URL") == "postgresql+psycopg://trainer@db.internal:5432/exgrpo_experience"
    assert reveal_url("sqlite:////tmp/x.db", "EXGRPO_DB_URL") == "sqlite:////tmp/x.db"


def test_overrides_sent_to_prefect_keep_the_secret_in_the_environment(monkeypatch):
    monkeypatch.delenv("EXGRPO_DB_URL", raising=False)
    monkeypatch.delenv("EXGRPO_ROLLOUT_API_KEY", raising=False)
    real = URL.replace("***", "s3cret")
    sent = hide_overrides([f"run.db_url={real}", "rollout.server_api_key=k3y", "run.steps=2"])
    assert sent == [f"run.db_url={URL}", "rollout.server_api_key='***'", "run.steps=2"]
    cfg = reveal(load_config("tiny", sent))  # what the receiving flow run trains with
    assert cfg.run.db_url == real and cfg.rollout.server_api_key == "k3y" and cfg.run.steps == 2
    assert hide_overrides(["run.steps=2"]) == ["run.steps=2"]


def test_a_masked_tracking_uri_comes_from_mlflow_tracking_uri(monkeypatch, tmp_path):
    from flows.tracking import resolve_tracking_uri

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://bob:s3cret@mlflow.internal:5000")
    masked = "http://bob:***@mlflow.internal:5000"
    cfg = load_config("tiny", [f"run.output_dir={tmp_path}", f"run.mlflow_tracking_uri={masked}"])
    assert resolve_tracking_uri(cfg) == "http://bob:s3cret@mlflow.internal:5000"
