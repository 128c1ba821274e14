"""benchmarks/scale/synth_store.fill: the synthetic run is a consistent store that the real API keeps using."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from sqlalchemy import func, select
from store_helpers import BACKENDS, fresh_database, group, update

from exgrpo_core.store.experience_store import ExperienceStore
from exgrpo_core.store.tables import GroupResultRow, QuestionState, Replay, StepMetric, Trajectory

_spec = importlib.util.spec_from_file_location(
    "synth_store", Path(__file__).resolve().parents[3] / "benchmarks" / "scale" / "synth_store.py")
synth_store = sys.modules["synth_store"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(synth_store)


@pytest.fixture(params=BACKENDS)
def fresh_url(request, tmp_path):
    """A new SQLite file, or a new PostgreSQL database dropped afterwards."""
    yield from fresh_database(request.param, tmp_path, "exgrpo_synth")


def test_fill_stores_a_consistent_run_with_real_payloads_and_the_store_keeps_working(fresh_url):
    run_id = synth_store.fill(fresh_url, 3000, seed=1, group_size=8, response_tokens=32)
    store = ExperienceStore(fresh_url)
    T, QS = Trajectory, QuestionState
    with store.engine.connect() as c:
        n_traj = c.execute(select(func.count()).select_from(T).where(T.run_id == run_id)).scalar_one()
        # per-question pool counters agree with the trajectories' flags
        pooled = dict(c.execute(select(T.question_id, func.count()).where(T.run_id == run_id, T.in_pool.is_(True))
                                .group_by(T.question_id)).all())
        sizes = {q: p for q, p in c.execute(select(QS.question_id, QS.pool_size).where(QS.run_id == run_id)) if p}
        retired_q = set(c.execute(select(QS.question_id).where(QS.run_id == run_id, QS.retired.is_(True))).scalars())
        pooled_of_retired = c.execute(select(func.count()).select_from(T).where(
            T.run_id == run_id, T.in_pool.is_(True), T.question_id.in_(retired_q))).scalar_one()
        groups = c.execute(select(func.count()).select_from(GroupResultRow)
                           .where(GroupResultRow.run_id == run_id)).scalar_one()
        replays = c.execute(select(func.count()).select_from(Replay).where(Replay.run_id == run_id)).scalar_one()
        metrics = c.execute(select(func.count(func.distinct(StepMetric.step)))
                            .where(StepMetric.run_id == run_id)).scalar_one()
    assert 3000 <= n_traj < 3000 + 8
    assert pooled == sizes and sum(sizes.values()) > 0
    assert retired_q and pooled_of_retired == 0
    assert groups >= n_traj // 8 and replays > 0
    run = store.get_run(run_id)
    assert run["replay_active"] and metrics == run["step"] + 1

    state = store.buffer_state(run_id, 8)
    assert state.pool_trajectories == sum(sizes.values()) and state.retired_questions == len(retired_q)
    uid = state.buckets[min(state.buckets)][0]
    cands = store.candidates(run_id, [uid], before_step=run["step"] + 1)[uid]
    assert cands and all(8 <= len(e.response_ids) == len(e.behaviour_logprobs) <= 32 for e in cands)
    assert all(0 <= t < synth_store.VOCAB for e in cands for t in e.response_ids)
    assert all(lp <= 0 for e in cands for lp in e.behaviour_logprobs)

    # new rows get fresh ids after the bulk fill (sequences moved past the copied ids)
    step = run["step"] + 1
    out = update(store, run_id, step, [group(uid, [1, 0, 0, 0, 0, 0, 0, 0], step=step)], group_size=8, hi=7)
    assert out["buffer/collected"] == 1
    store.record_replays(run_id, step, [(cands[0].id, 0.1)])
    assert store.rollback_to(run_id, run["step"])["trajectories"] == 8
    assert store.buffer_state(run_id, 8).pool_trajectories == state.pool_trajectories
    store.close()


def test_fill_refuses_bad_sizes_before_touching_the_database(tmp_path):
    url = f"sqlite:///{tmp_path / 'never.db'}"
    with pytest.raises(ValueError, match="group_size >= 2"):
        synth_store.fill(url, 100, group_size=1)
    with pytest.raises(ValueError, match="n_questions must be >= 128"):
        synth_store.fill(url, 100, n_questions=10)
    assert not (tmp_path / "never.db").exists()
