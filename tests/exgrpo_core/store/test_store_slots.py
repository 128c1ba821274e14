"""Pool slots (store_replay, migration 0005): buckets stay dense arrays kept by swap-remove, in the
order a plain-Python model of the rule gives; rollback restores them exactly; upgrading a database
with data numbers existing pools by uid; sampling keeps matching the reference on all of it.

Run: `.venv/bin/python -m pytest tests/exgrpo_core/test_store_slots.py -q`.
"""

from __future__ import annotations

import random
import uuid

import pytest
from alembic import command
from sqlalchemy import select
from store_helpers import BACKENDS, dump_run, fresh_database, group, questions, store, update  # noqa: F401
from test_store_sampling import check_same_as_reference

from exgrpo_core.store.experience_store import ExperienceStore, StoreError
from exgrpo_core.store.engine import _alembic_config, create_store_engine, parse_url
from exgrpo_core.store.tables import PoolSlotLog, Run
from exgrpo_core.store.replay import plan_slot_moves

K = 4


class SlotModel:
    """The buffer rules with plain lists: per step, leavers swap-removed in descending slot order,
    then joiners appended in uid order (collect 1 <= k <= 3, retire at k == K, exact-text dedup)."""

    def __init__(self):
        self.latest, self.retired, self.texts, self.buckets = {}, set(), {}, {}

    def step(self, groups) -> None:
        before = {u: k for k, v in self.buckets.items() for u in v}
        for g in groups:
            k, uid = g.k, g.question_uid
            if 1 <= k <= K - 1:
                self.texts.setdefault(uid, set()).update(r.text for r in g.rollouts if r.reward > 0)
            if k == K:
                self.retired.add(uid)
            self.latest[uid] = k
        after = {u: self.latest[u] for u in self.latest if u not in self.retired and self.texts.get(u)}
        leaving = [(before[u], self.buckets[before[u]].index(u), u) for u in before
                   if after.get(u) != before[u]]
        for k, slot, u in sorted(leaving, key=lambda x: (x[0], -x[1])):
            b = self.buckets[k]
            b[slot] = b[-1]
            b.pop()
        for k, u in sorted((k, u) for u, k in after.items() if before.get(u) != k):
            self.buckets.setdefault(k, []).append(u)
        self.buckets = {k: v for k, v in sorted(self.buckets.items()) if v}


def play(s: ExperienceStore, run_id: str, uids: list[str], step: int, model: SlotModel | None = None) -> None:
    rng = random.Random(f"{run_id[:4]}-{step}")  # the same groups for runs sharing the prefix
    groups = []
    for u in rng.sample(uids, rng.randrange(1, len(uids))):
        p = rng.random()
        rewards = [int(rng.random() < p) for _ in range(K)]
        groups.append(group(u, rewards, [f"{u} t{rng.randrange(4)}" for _ in rewards], step))
    update(s, run_id, step, groups, group_size=K, retire=True)
    s.update_run(run_id, step=step)
    if model:
        model.step(groups)


def start(s: ExperienceStore, prefix: str, uids: list[str], tag: str) -> str:
    run_id = f"{prefix}{uuid.uuid4().hex[:20]}"
    s.start_run(run_id, run_id, "tiny", {}, K)
    s.register_questions(run_id, questions(uids, tag=tag))
    return run_id


def test_buckets_follow_the_swap_remove_model_step_by_step(store):
    uids = [f"q{i}" for i in range(30)]
    run_id = start(store, "m", uids, uuid.uuid4().hex)
    model, moved = SlotModel(), 0
    for step in range(12):
        play(store, run_id, uids, step, model)
        state = store.buffer_state(run_id, K)
        got = state.buckets
        assert got == model.buckets, f"step {step}"
        counts = store.buffer_state(run_id, K, with_buckets=False)  # one aggregate: the same sizes
        assert (counts.pool_questions, counts.pool_trajectories, counts.retired_questions, counts.bucket_counts) == (
            state.pool_questions, state.pool_trajectories, state.retired_questions, state.bucket_counts)
        assert counts.pool_questions == sum(map(len, model.buckets.values())), f"step {step}"
        moved += any(v != sorted(v) for v in got.values())
    assert moved > 0  # holes were filled from the end, not re-sorted
    check_same_as_reference(store, run_id, range(40))


def test_rollback_restores_slots_and_the_resumed_run_samples_the_same(store):
    uids, tag = [f"q{i}" for i in range(40)], uuid.uuid4().hex
    stopped, rolled = start(store, "aaaa", uids, tag), start(store, "aaaa", uids, tag)
    for step in range(4):
        play(store, stopped, uids, step)
    for step in range(9):
        play(store, rolled, uids, step)
    assert dump_run(store, rolled) != dump_run(store, stopped)
    store.rollback_to(rolled, 3)
    assert dump_run(store, rolled) == dump_run(store, stopped)  # slots included
    assert store.buffer_state(rolled, K) == store.buffer_state(stopped, K)
    with store.engine.connect() as c:
        assert c.execute(select(PoolSlotLog.step).where(PoolSlotLog.run_id == rolled, PoolSlotLog.step > 3)).all() == []
    for step in range(4, 7):
        play(store, rolled, uids, step)
        play(store, stopped, uids, step)
        assert store.buffer_state(rolled, K) == store.buffer_state(stopped, K)
    w = {1: 1.0, 2: 2.0, 3: 1.0}
    assert (store.sample_replay_questions(rolled, K, 9, w, random.Random(5))
            == store.sample_replay_questions(stopped, K, 9, w, random.Random(5)))


def test_plan_slot_moves_fills_holes_from_the_end_and_appends_newcomers():
    a, b, c, d, e, x = 1, 2, 3, 4, 5, 6
    moves = plan_slot_moves({1: 5, 2: 0}, [(1, 1, b), (1, 4, e)], [(2, "x", x), (2, "b", b)],
                            {(1, 3): d, (1, 4): e})
    # e (last) is popped, d fills b's hole, b then x append to bucket 2 in uid order
    assert moves == {e: (4, None), d: (3, 1), b: (1, 0), x: (None, 1)}
    assert plan_slot_moves({1: 2}, [(1, 0, a), (1, 1, c)], [], {(1, 0): a, (1, 1): c}) == {a: (0, None),
                                                                                          c: (1, None)}
    assert plan_slot_moves({1: 1}, [], [], {}) == {}
    with pytest.raises(StoreError, match="inconsistent: question 1 at slot 3, bucket size 2"):
        plan_slot_moves({1: 2}, [(1, 3, a)], [], {})
    with pytest.raises(StoreError, match="not dense: nothing at slot 2"):
        plan_slot_moves({1: 3}, [(1, 0, a)], [], {})


@pytest.fixture(params=BACKENDS)
def empty_url(request, tmp_path):
    yield from fresh_database(request.param, tmp_path, "exgrpo_slots")


def _migrate(url: str, revision: str, down: bool) -> None:
    cfg, engine = _alembic_config(), create_store_engine(parse_url(url))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        (command.downgrade if down else command.upgrade)(cfg, revision)
    engine.dispose()


def test_upgrading_a_database_with_data_numbers_pools_by_uid_and_rollback_before_it_renumbers(empty_url):
    uids, tag = [f"q{i}" for i in range(30)], uuid.uuid4().hex
    s = ExperienceStore(empty_url)
    stopped, rolled = start(s, "bbbb", uids, tag), start(s, "bbbb", uids, tag)
    for step in range(3):
        play(s, stopped, uids, step)
    for step in range(6):
        play(s, rolled, uids, step)
    members = {r: {k: sorted(v) for k, v in s.buffer_state(r, K).buckets.items()} for r in (stopped, rolled)}
    assert any(v != sorted(v) for v in s.buffer_state(rolled, K).buckets.values())
    s.close()
    _migrate(empty_url, "0004", down=True)  # the previous release's schema, rows kept, slots gone
    s = ExperienceStore(empty_url)  # upgrades to head (0005 backfill)
    for r in (stopped, rolled):
        assert s.buffer_state(r, K).buckets == members[r]  # dense, code-point uid order
        check_same_as_reference(s, r, range(15))
    with s.engine.connect() as c:
        assert dict(c.execute(select(Run.id, Run.slots_logged_after).where(Run.id.in_([stopped, rolled]))).all()) \
            == {stopped: 2, rolled: 5}
    s.rollback_to(rolled, 2)  # before the log starts: renumbered, i.e. what the migration gives the stopped run
    assert dump_run(s, rolled) == dump_run(s, stopped)
    for step in range(3, 6):  # and logged from there on
        play(s, rolled, uids, step)
        play(s, stopped, uids, step)
    s.rollback_to(rolled, 4)
    s.rollback_to(stopped, 4)
    assert dump_run(s, rolled) == dump_run(s, stopped)
    s.close()
