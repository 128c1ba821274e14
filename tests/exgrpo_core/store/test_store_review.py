"""Retired-set review (buffer.review_retired_every / review_fraction, the paper's Table 7).

A review puts ceil(fraction x |retired|) retired questions, drawn by the run's seeded generator, back
in on-policy sampling and their experiences back in the pool; a rollback before the review retires
them again, so a resumed run reviews the same questions and ends row for row like an uninterrupted one.
"""

from __future__ import annotations

import random
import types

import pytest
from sqlalchemy import select
from store_helpers import dump_run, group, questions, rollout, store, update  # noqa: F401

from exgrpo_core import loop
from exgrpo_core import metrics as M
from exgrpo_core.config.load import load_config
from exgrpo_core.store.buffer import review_count
from exgrpo_core.store.engine import StoreError
from exgrpo_core.store.tables import QuestionState, RetirementReview, Trajectory

K = 4
UIDS = [f"q{i}" for i in range(12)]


def start(store, tag: str, uids=UIDS, qtag: str | None = None) -> str:
    run_id = f"{tag}-{random.Random().getrandbits(64):016x}"
    store.start_run(run_id, run_id, "tiny", {"seed": 0}, K)
    store.register_questions(run_id, questions(uids, tag=qtag or run_id))
    return run_id


def _k(uid: str, k: int, step: int):
    return group(uid, [1] * k + [0] * (K - k), [f"{uid} s{step} r{i}" for i in range(K)], step)


def _states(store, run_id):
    QS = QuestionState
    with store.engine.connect() as c:
        return {u: (bool(r), rs, p) for u, r, rs, p in c.execute(
            select(QS.uid, QS.retired, QS.retired_step, QS.pool_size).where(QS.run_id == run_id))}


def _pooled_trajectories(store, run_id):
    QS, T = QuestionState, Trajectory
    with store.engine.connect() as c:
        return {(u, bool(p), bool(r)) for u, p, r in c.execute(
            select(QS.uid, T.in_pool, T.retired).join(QS, (QS.run_id == T.run_id) & (QS.question_id == T.question_id))
            .where(T.run_id == run_id, T.reward > 0, T.collected_step == 0))}  # the experiences of step 0


def test_review_count_is_the_ceiling_of_the_fraction():
    assert [review_count(0.1, n) for n in (0, 1, 9, 10, 11, 30)] == [0, 1, 1, 1, 2, 3]
    assert review_count(0.25, 10) == 3 and review_count(1.0, 7) == 7
    with pytest.raises(StoreError, match="review fraction"):
        review_count(0.0, 5)


def test_a_review_puts_back_exactly_the_fraction_drawn_by_the_rng(store):
    run_id = start(store, "review")
    update(store, run_id, 0, [_k(u, 2, 0) for u in UIDS])  # every question pooled with 2 experiences
    update(store, run_id, 1, [_k(u, K, 1) for u in UIDS[:10]])  # 10 retired, their experiences out of the pool
    assert store.retired_uids(run_id) == set(UIDS[:10])
    rng, twin = random.Random(7), random.Random(7)
    reviewed = store.review_retired(run_id, 5, 0.25, rng)
    # ceil(0.25 x 10) = 3, the draw rng.sample(retired uids in code-point order, 3) makes
    assert reviewed == twin.sample(sorted(UIDS[:10]), 3) and len(set(reviewed)) == 3
    assert rng.random() == twin.random()  # exactly that draw, nothing more
    assert store.retired_uids(run_id) == set(UIDS[:10]) - set(reviewed)  # the other 7 stay retired
    st = _states(store, run_id)
    assert all(st[u] == (False, None, 2) for u in reviewed)
    assert all(st[u][:2] == (True, 1) and st[u][2] == 0 for u in set(UIDS[:10]) - set(reviewed))
    traj = _pooled_trajectories(store, run_id)
    assert {(u, p, r) for u, p, r in traj if u in reviewed} == {(u, True, False) for u in reviewed}
    assert {(p, r) for u, p, r in traj if u in set(UIDS[:10]) - set(reviewed)} == {(False, True)}
    # back in the pool, in their latest bucket (k = K, never drawn until a new group moves them); slots dense
    state = store.buffer_state(run_id, K)
    assert sorted(state.buckets[K]) == sorted(reviewed) and state.retired_questions == 7
    assert state.pool_questions == 2 + 3
    with store.engine.connect() as c:
        logged = c.execute(select(RetirementReview.step, RetirementReview.retired_step)
                           .where(RetirementReview.run_id == run_id)).all()
    assert sorted(logged) == [(5, 1)] * 3
    # a new group moves a reviewed question to a drawable bucket; a review of an empty set draws nothing
    update(store, run_id, 6, [_k(reviewed[0], 1, 6)])
    assert reviewed[0] in store.buffer_state(run_id, K).buckets[1]
    empty, before = start(store, "empty"), random.Random(3)
    after = random.Random(3)
    assert store.review_retired(empty, 5, 0.5, after) == [] and after.random() == before.random()


def play(store, run_id: str, step: int, rng: random.Random) -> None:
    """Steps 0-5: pool everything, retire q0-q5 at 1, review at 3 (3 of 6), re-retire the reviewed and q7
    at 4, review again at 5."""
    if step == 0:
        update(store, run_id, 0, [_k(u, 2, 0) for u in UIDS])
    elif step == 1:
        update(store, run_id, 1, [_k(u, K, 1) for u in UIDS[:6]])
    elif step == 2:
        update(store, run_id, 2, [_k("q6", 1, 2)])
    elif step == 4:
        back = sorted(set(UIDS[:6]) - store.retired_uids(run_id))
        update(store, run_id, 4, [_k(u, K, 4) for u in back[:2]] + [_k("q7", K, 4), _k(back[2], 3, 4)])
    if step in (3, 5):
        update(store, run_id, step, [_k("q8", 3, step)])
        store.review_retired(run_id, step, 0.5, rng)
    store.update_run(run_id, step=step)


def test_a_resumed_run_reviews_the_same_questions_and_rollback_undoes_reviews(store):
    tag = f"t{random.Random().getrandbits(32):08x}"  # questions shared by the three runs
    straight, stopped, resumed = (start(store, n, qtag=tag) for n in ("straight", "stopped", "resumed"))
    rng = random.Random(11)
    for step in range(6):
        play(store, straight, step, rng)
    rng = random.Random(11)
    for step in range(3):
        play(store, stopped, step, rng)
    checkpoint = rng.getstate()  # what the checkpoint of step 2 saves
    rng = random.Random(11)
    for step in range(6):
        play(store, resumed, step, rng)
    assert dump_run(store, resumed) == dump_run(store, straight)
    store.rollback_to(resumed, 2)  # both reviews and the re-retirement between them undone
    assert dump_run(store, resumed) == dump_run(store, stopped)
    assert store.retired_uids(resumed) == set(UIDS[:6])
    with store.engine.connect() as c:
        assert c.execute(select(RetirementReview.id).where(RetirementReview.run_id == resumed)).all() == []
    rng = random.Random()
    rng.setstate(checkpoint)
    for step in range(3, 6):
        play(store, resumed, step, rng)
    assert dump_run(store, resumed) == dump_run(store, straight)
    store.rollback_to(resumed, 3)  # between the reviews: the first stays, q7 and the re-retired are undone
    store.rollback_to(straight, 3)
    assert dump_run(store, resumed) == dump_run(store, straight)
    assert len(store.retired_uids(resumed)) == 3


def _session(store, run_id, overrides):
    cfg = load_config("tiny", ["rollout.group_size=4", *overrides])
    return types.SimpleNamespace(cfg=cfg, store=store, run_id=run_id, rng=random.Random(5), replay_active=True)


def _rollouts(uids, k, step):
    return [rollout(u, float(i < k), f"{u} s{step} r{i}", step) for u in uids for i in range(K)]


@pytest.mark.parametrize("every, reviews_at", [(0, []), (2, [2, 4]), (3, [3])])
def test_the_loop_reviews_at_step_numbers_divisible_by_the_period(store, every, reviews_at):
    run_id = start(store, "loop")
    s = _session(store, run_id, [f"buffer.review_retired_every={every}", "buffer.review_fraction=0.5"])
    seen = {}
    for index in range(4):  # step numbers 1..4
        uids = UIDS[2 * index:2 * index + 2]
        _, stats = loop.update_buffer(s, loop.BatchPlan(index, uids, []), _rollouts(uids, K, index))  # 2 retired
        seen[M.step_number(index)] = stats[M.REVIEWED_RETIRED]
    # each step retires 2 more; a review step then puts back ceil(0.5 x retired)
    expected = {1: 0.0, 2: 0.0, 3: 0.0, 4: 0.0}
    retired = 0
    for n in range(1, 5):
        retired += 2
        if n in reviews_at:
            expected[n] = float(review_count(0.5, retired))
            retired -= review_count(0.5, retired)
    assert seen == expected
    assert len(store.retired_uids(run_id)) == retired
