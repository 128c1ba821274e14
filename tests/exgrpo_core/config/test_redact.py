"""Credentials are masked wherever a config or URL is recorded (issue 35, item 5): one helper, and each
place that records one (MLflow params, tags and config.yaml, `runs.config_json`, Prefect parameters)."""

from __future__ import annotations

import json
import os

import pytest

from exgrpo_core.config.load import load_config
from exgrpo_core.config.redact import hide, mask_text, masked, masked_config

PG_URL = os.environ.get("EXGRPO_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
SECRET = "s3cr3t-pw"
# trust authentication on the test server ignores the password: the URL still connects
PG_WITH_PASSWORD = PG_URL.replace("postgres@", f"postgres:{SECRET}@")


def test_mask_text_hides_url_passwords_and_secret_query_values():
    assert mask_text(f"postgresql+psycopg://bob:{SECRET}@db:5432/x") == "postgresql+psycopg://bob:***@db:5432/x"
    assert mask_text(f"http://h/api?token={SECRET}&a=1") == "http://h/api?token=***&a=1"
    assert mask_text(f"--set run.db_url=postgres://u:p@ss{SECRET}@h/d --x") == "--set run.db_url=postgres://u:***@h/d --x"
    for plain in ("sqlite:////tmp/a.db", "postgresql://bob@db/x", "http://127.0.0.1:5000", "user:pw without scheme"):
        assert mask_text(plain) == plain


def test_masked_config_hides_urls_and_secret_fields():
    cfg = load_config("tiny", [f"run.db_url={PG_WITH_PASSWORD}", f"run.mlflow_tracking_uri=http://u:{SECRET}@h:5000",
                               f"rollout.server_api_key={SECRET}"])
    out = masked_config(cfg)
    assert SECRET not in json.dumps(out)
    assert out["run"]["db_url"] == PG_WITH_PASSWORD.replace(SECRET, "***")
    assert out["rollout"]["server_api_key"] == "***"
    assert SECRET not in json.dumps(masked({"rollout.server_api_key": SECRET}))  # flattened keys too
    assert SECRET in cfg.run.db_url  # the config itself is unchanged


def test_prefect_parameters_hold_no_credentials_and_the_run_still_finds_them(tmp_path, monkeypatch):
    from exgrpo_core.store.experience_store import resolve_db_url
    from flows.tracking import resolve_tracking_uri

    for env in ("EXGRPO_DB_URL", "MLFLOW_TRACKING_URI", "EXGRPO_ROLLOUT_API_KEY"):
        monkeypatch.setenv(env, "restored-after-the-test")
    cfg = load_config("tiny", [f"run.db_url={PG_WITH_PASSWORD}", f"run.mlflow_tracking_uri=http://u:{SECRET}@h:5000",
                               f"rollout.server_api_key={SECRET}", f"run.output_dir={tmp_path}"])
    params = hide(cfg)
    assert SECRET not in params.model_dump_json()  # what Prefect records for the flow run
    assert resolve_db_url(params.run.db_url, tmp_path) == PG_WITH_PASSWORD
    assert resolve_tracking_uri(params) == f"http://u:{SECRET}@h:5000"
    assert os.environ["EXGRPO_ROLLOUT_API_KEY"] == SECRET
    plain = load_config("tiny", [f"run.output_dir={tmp_path}"])
    assert hide(plain) is plain


def test_mlflow_params_tags_and_config_yaml_hold_no_credentials(tmp_path):
    import mlflow

    from flows.tracking import MlflowRun

    cfg = load_config("tiny", [f"run.db_url={PG_WITH_PASSWORD}", f"run.mlflow_tracking_uri=sqlite:///{tmp_path / 'm.db'}"])
    run = MlflowRun(cfg, None, tags={"exgrpo.cli_equivalent": f"exgrpo train --set run.db_url={PG_WITH_PASSWORD}"})
    run.set_tags({"exgrpo.later": PG_WITH_PASSWORD})
    run.end()
    client = mlflow.MlflowClient(tracking_uri=cfg.run.mlflow_tracking_uri)
    data = client.get_run(run.run_id).data
    assert data.params["run.db_url"] == PG_WITH_PASSWORD.replace(SECRET, "***")
    assert SECRET not in json.dumps(data.params) and SECRET not in json.dumps(data.tags)
    text = open(client.download_artifacts(run.run_id, "config.yaml", str(tmp_path))).read()
    assert "db_url" in text and SECRET not in text


@pytest.mark.postgres
def test_runs_config_json_holds_no_credentials(tmp_path):
    import sqlalchemy as sa

    from exgrpo_core.run.session import open_session

    cfg = load_config("tiny", [f"run.output_dir={tmp_path}", f"run.db_url={PG_WITH_PASSWORD}",
                               f"run.name=redact-{os.getpid()}-{tmp_path.name[-8:]}"])
    s = open_session(cfg, verify=lambda t, a: [(0.0, "wrong")] * len(t))
    try:
        with s.store.engine.connect() as c:
            raw = c.execute(sa.text("select config_json from runs where id = :i"), {"i": s.run_id}).scalar_one()
        assert SECRET not in raw and json.loads(raw)["run"]["db_url"] == PG_WITH_PASSWORD.replace(SECRET, "***")
    finally:
        s.close()
