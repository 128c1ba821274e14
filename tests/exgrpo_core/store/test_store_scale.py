"""Store changes made for scale (benchmarks/scale/db_scale.py): migration 0002 keeps data, COPY path errors and
atomicity, bucket order independent of the database's collation."""

from __future__ import annotations


import pytest
from alembic import command
from sqlalchemy import inspect
from store_helpers import BACKENDS, fresh_database, PG_URL, dump_run, group, new_run, questions, rollout, store, update  # noqa: F401

from exgrpo_core.store.experience_store import ExperienceStore, StoreError
from exgrpo_core.store import engine as store_engine
from exgrpo_core.store.engine import _alembic_config, create_store_engine, parse_url
from exgrpo_core.types import GroupResult

NEW_INDEXES = {"trajectories": "ix_trajectories_run_collected_step", "group_results": "ix_group_results_run_step",
               "replays": "ix_replays_run_question", "question_states": "ix_question_states_run_retired_step"}


@pytest.fixture(params=BACKENDS)
def empty_url(request, tmp_path):
    yield from fresh_database(request.param, tmp_path, "exgrpo_scale")


def test_upgrade_from_0001_keeps_every_row_and_adds_the_rollback_indexes(empty_url):
    s = ExperienceStore(empty_url)
    run, (q0, q1, _, _) = new_run(s)
    update(s, run, 0, [group(q0, [1, 0, 0, 0]), group(q1, [1, 1, 1, 1])])
    s.log_metrics(run, 0, {"rollout/reward_mean": 0.5})
    before = dump_run(s, run)
    s.close()
    engine = create_store_engine(parse_url(empty_url))
    cfg = _alembic_config()
    with engine.begin() as conn:  # back to the schema of the first release, rows kept
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0001")
    assert not any(NEW_INDEXES[t] in {i["name"] for i in inspect(engine).get_indexes(t)} for t in NEW_INDEXES)
    engine.dispose()

    new = ExperienceStore(empty_url)
    assert new.revision == store_engine.head_revision() and dump_run(new, run) == before
    for table, index in NEW_INDEXES.items():
        assert index in {i["name"] for i in inspect(new.engine).get_indexes(table)}
    new.close()


def test_buffer_state_orders_each_bucket_by_code_point_on_both_backends(store):
    run, _ = new_run(store, n_questions=0)
    uids = ["q10", "q2", "Q1", "_a", "qé", "q1"]
    store.register_questions(run, questions(uids, tag=run))
    update(store, run, 0, [group(u, [1, 0, 0, 0]) for u in uids])
    assert store.buffer_state(run, 4).buckets == {1: sorted(uids)} == {1: ["Q1", "_a", "q1", "q10", "q2", "qé"]}


@pytest.mark.postgres
def test_copy_path_failure_is_a_store_error_and_leaves_nothing_behind(tmp_path):
    s = ExperienceStore(PG_URL)
    assert s.engine.dialect.name == "postgresql"
    run, (q0, q1, _, _) = new_run(s)
    update(s, run, 0, [group(q0, [1, 0, 0, 0])])
    before = dump_run(s, run)
    bad = GroupResult(q1, [rollout(q1, 1.0, "fine"), rollout(q1, 0.0, "nul \x00 byte")])  # PostgreSQL text has no NUL
    with pytest.raises(StoreError, match="storing 6 trajectories failed: .*0x00"):
        update(s, run, 1, [group(q0, [1, 1, 0, 0], step=1), bad])
    assert dump_run(s, run) == before
    s.close()


def test_sqlite_keeps_nul_text_exactly(tmp_path):
    s = ExperienceStore(f"sqlite:///{tmp_path / 'nul.db'}")
    run, (q0, _, _, _) = new_run(s)
    update(s, run, 0, [GroupResult(q0, [rollout(q0, 1.0, "nul \x00 byte"), rollout(q0, 0.0, "no")])])
    assert [e.text for e in s.candidates(run, [q0], 1)[q0]] == ["nul \x00 byte"]
    s.close()
