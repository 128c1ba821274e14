"""The dashboard only reads, on both backends, and keeps reading while a training run writes.

Each backend gets a fresh database (PostgreSQL: created here and dropped after) filled through the
real `ExperienceStore`; the dashboard's engine must refuse writes and must see committed steps only.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import uuid

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from dashboard import db, queries as Q
from exgrpo_core import metrics as M
from exgrpo_core.store.experience_store import ExperienceStore
from exgrpo_core.store.engine import scratch_postgres_database, write_transaction
from exgrpo_core.store.tables import Run
from exgrpo_core.types import Question

PG_URL = os.environ.get("EXGRPO_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


@pytest.fixture(params=[pytest.param("sqlite"), pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'exp.db'}"
        return
    with scratch_postgres_database(PG_URL, "exgrpo_dash") as u:  # fails (never skips) when the server is down
        try:
            yield u
        finally:
            db.readonly_engine.cache_clear()  # close the dashboard's pooled connections before the drop


def _started(url: str) -> tuple[ExperienceStore, str]:
    store = ExperienceStore(url)
    run_id = uuid.uuid4().hex
    store.start_run(run_id, "writer", "tiny", {}, group_size=4)
    store.register_questions(run_id, [Question(f"q{i}", ({"role": "user", "content": f"{i}+1"},), str(i + 1), "t")
                                      for i in range(6)])
    return store, run_id


def test_the_dashboard_engine_refuses_to_write(url):
    store, run_id = _started(url)
    engine = db.readonly_engine(url)
    with pytest.raises(DBAPIError, match="(?i)read-?only"):
        with engine.connect() as conn:
            conn.execute(sa.update(Run).values(status="killed"))
            conn.commit()
    assert store.get_run(run_id)["status"] == "running"
    store.close()


def test_pages_read_committed_steps_while_training_writes(url):
    store, run_id = _started(url)
    errors: list[BaseException] = []
    seen: list[int] = []
    steps = 30
    done = threading.Event()

    def train():
        try:
            for step in range(steps):
                store.log_metrics(run_id, step, {M.REWARD_MEAN: step / steps, M.BUFFER_QUESTIONS: step})
                store.update_run(run_id, step=step)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)
        finally:
            done.set()

    writer = threading.Thread(target=train)
    writer.start()
    for _ in range(100_000):
        runs = Q.list_runs(url)
        series = Q.metric_series(url, (run_id,), (M.REWARD_MEAN,))
        seen.append(int(runs.loc[runs.id == run_id, "step"].iloc[0]))
        assert len(series) >= seen[-1]  # a step is visible in runs only after its metrics were committed
        if done.is_set() and (seen[-1] == steps or errors):
            break
    writer.join()
    assert not errors, errors
    assert seen == sorted(seen) and seen[-1] == steps
    store.close()


def test_an_open_write_transaction_neither_blocks_nor_leaks_into_reads(url):
    store, run_id = _started(url)
    store.log_metrics(run_id, 0, {M.REWARD_MEAN: 0.5})
    with write_transaction(store.engine, "a long training step") as conn:
        conn.execute(sa.update(Run).where(Run.id == run_id).values(status="failed", step=41))
        runs = Q.list_runs(url)  # would wait for the busy timeout, then fail, if the writer blocked readers
        assert runs.loc[runs.id == run_id, "status"].iloc[0] == "running"
        assert Q.metric_series(url, (run_id,), (M.REWARD_MEAN,))["value"].tolist() == [0.5]
    runs = Q.list_runs(url)
    assert runs.loc[runs.id == run_id, "status"].iloc[0] == "failed"
    store.close()


def test_a_database_without_tables_reads_as_no_runs(url):
    if url.startswith("sqlite:///"):
        sqlite3.connect(url.removeprefix("sqlite:///")).close()  # an empty file, as before training's first write
    assert Q.list_runs(url).empty
    rows, n = Q.search_questions(url, "no-such-run")
    assert rows.empty and n == 0
