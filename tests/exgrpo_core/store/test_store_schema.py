"""Experience store plumbing: migrations to head, URL checks, SQLite concurrency, runs, metrics, evaluations."""

from __future__ import annotations

import math
import uuid

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, insert, text
from store_helpers import BACKENDS, PG_URL, dump_run, new_run, store, fresh_database  # noqa: F401

from exgrpo_core.store.experience_store import ExperienceStore, StoreError, resolve_db_url
from exgrpo_core.store.engine import head_revision
from exgrpo_core.store.tables import Base, StepMetric

TABLES = {"runs", "questions", "question_states", "group_results", "trajectories", "replays", "step_metrics",
          "eval_results", "pool_slot_log", "reward_changes", "retirement_reviews", "alembic_version"}


@pytest.fixture(params=BACKENDS)
def empty_db_url(request, tmp_path):
    """URL of an empty database: a new SQLite file, or a new PostgreSQL database dropped afterwards."""
    yield from fresh_database(request.param, tmp_path, "exgrpo_mig")


def test_empty_database_is_migrated_to_head_matching_the_models_and_reopen_is_idempotent(empty_db_url):
    s = ExperienceStore(empty_db_url)
    assert s.revision == head_revision() == "0007"
    assert set(inspect(s.engine).get_table_names()) == TABLES
    with s.engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata) == []
    run, _ = new_run(s)
    s.close()
    again = ExperienceStore(empty_db_url)
    assert again.upgrade() == head_revision()
    assert again.get_run(run)["step"] == -1  # data survived the re-open
    with again.engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all() == ["0007"]
    again.close()


@pytest.mark.parametrize("url, needle", [
    ("foo://x", "unknown database dialect 'foo'"),
    ("not a url", "invalid database URL"),
    ("mysql://u@h/db", "unknown database dialect 'mysql'"),
])
def test_bad_urls_are_named(url, needle):
    with pytest.raises(StoreError, match=needle):
        ExperienceStore(url)


@pytest.mark.postgres
def test_unreachable_postgres_names_the_server_and_masks_the_password():
    with pytest.raises(StoreError) as err:
        ExperienceStore("postgresql+psycopg://postgres:secret@127.0.0.1:1/test")
    msg = str(err.value)
    assert "cannot connect" in msg and "127.0.0.1:1" in msg and "***" in msg and "secret" not in msg


def test_sqlite_path_in_a_missing_folder_is_named(tmp_path):
    with pytest.raises(StoreError, match=f"folder does not exist: {tmp_path / 'missing'}"):
        ExperienceStore(f"sqlite:///{tmp_path}/missing/experience.db")


def test_resolve_db_url_prefers_config_then_env_then_run_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("EXGRPO_DB_URL", raising=False)
    assert resolve_db_url(None, tmp_path / "run") == f"sqlite:///{tmp_path / 'run' / 'experience.db'}"
    monkeypatch.chdir(tmp_path)
    assert resolve_db_url(None, "rel") == f"sqlite:///{tmp_path / 'rel' / 'experience.db'}"  # absolute
    monkeypatch.setenv("EXGRPO_DB_URL", "postgresql+psycopg://u@h/db")
    assert resolve_db_url(None, "rel") == "postgresql+psycopg://u@h/db"
    assert resolve_db_url("sqlite:////x/y.db", "rel") == "sqlite:////x/y.db"


def test_sqlite_reader_is_not_blocked_by_an_open_write_transaction(tmp_path):
    url = f"sqlite:///{tmp_path / 'wal.db'}"
    writer, reader = ExperienceStore(url), ExperienceStore(url)
    run, _ = new_run(writer)
    writer.log_metrics(run, 0, {"rollout/reward_mean": 0.25})
    with writer.engine.connect().execution_options(write=True) as conn, conn.begin():
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30_000
        conn.execute(insert(StepMetric).values(run_id=run, step=1, key="rollout/reward_mean", value=0.5))
        # uncommitted: the reader sees the last committed state, at once
        assert reader.get_metrics(run) == {"rollout/reward_mean": [(0, 0.25)]}
    assert reader.get_metrics(run) == {"rollout/reward_mean": [(0, 0.25), (1, 0.5)]}
    writer.close(), reader.close()


def test_runs_start_resume_find_and_update(store):
    run, _ = new_run(store)
    assert store.start_run(run, "ignored", "tiny", {}, 4) is False  # resume
    with pytest.raises(StoreError, match="group_size 4; cannot resume it with group_size 8"):
        store.start_run(run, "x", "tiny", {}, 8)
    name = f"named-{uuid.uuid4().hex}"
    first, second = uuid.uuid4().hex, uuid.uuid4().hex
    assert store.find_run_by_name(name) is None
    store.start_run(first, name, "cpu", {"a": [1, 2]}, 8)
    store.start_run(second, name, "cpu", {"a": [1, 2]}, 8)
    assert store.find_run_by_name(name) == second
    store.update_run(second, status="finished", step=7, mlflow_run_id="m1", replay_active=True, replay_started_step=3)
    got = store.get_run(second)
    assert {k: got[k] for k in ("name", "preset", "status", "step", "group_size", "config", "mlflow_run_id",
                                "replay_active", "replay_started_step")} == dict(
        name=name, preset="cpu", status="finished", step=7, group_size=8, config={"a": [1, 2]},
        mlflow_run_id="m1", replay_active=True, replay_started_step=3)
    assert got["updated_at"] >= got["created_at"] and got["created_at"].tzinfo is not None
    assert store.get_run("missing") is None
    with pytest.raises(StoreError, match="status must be one of"):
        store.update_run(second, status="done")
    with pytest.raises(StoreError, match="unknown fields \\['name'\\]"):
        store.update_run(second, name="x")
    with pytest.raises(StoreError, match="unknown run id"):
        store.update_run("missing", step=1)


def test_metrics_upsert_and_read_back_nan(store):
    run, _ = new_run(store)
    store.log_metrics(run, 1, {"loss/total": 0.5, "loss/kl": float("nan")})
    store.log_metrics(run, 0, {"loss/total": 1.0})
    store.log_metrics(run, 1, {"loss/total": 0.25})  # upsert
    got = store.get_metrics(run)
    assert got["loss/total"] == [(0, 1.0), (1, 0.25)]
    assert math.isnan(got["loss/kl"][0][1])
    assert store.get_metrics(run, ["loss/total"]) == {"loss/total": [(0, 1.0), (1, 0.25)]}
    with pytest.raises(StoreError, match="metric 'bad' is not a number"):
        store.log_metrics(run, 2, {"bad": "x"})
    store.save_eval(run, 5, "gsm8k", {"pass1": 0.5, "mean_length": 12.0}, n=10)
    assert dump_run(store, run)["eval_results"] == [(5, "gsm8k", "mean_length", 12.0, 10),
                                                    (5, "gsm8k", "pass1", 0.5, 10)]
