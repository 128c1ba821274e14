"""Experience store behaviour (docs/implementation_details.md) on SQLite and PostgreSQL: collection, de-duplication, retirement,
buckets, candidates, replay counters, run isolation and atomicity.

Run: `.venv/bin/python -m pytest tests/exgrpo_core/test_store.py -q` (`-m "not postgres"` for SQLite only).
"""

from __future__ import annotations

import random

import pytest
from sqlalchemy import select
from store_helpers import dump_run, group, new_run, questions, rollout, store, update  # noqa: F401

from exgrpo_core.store.experience_store import StoreError
from exgrpo_core.store.tables import QuestionState
from exgrpo_core.types import GroupResult


def pooled_texts(store, run_id, uid, before_step=10**9):
    return sorted(e.text for e in store.candidates(run_id, [uid], before_step)[uid])


def test_collection_bounds_all_wrong_and_all_right_groups_collect_nothing(store):
    run, (q0, q1, q2, _) = new_run(store)
    stats = update(store, run, 0, [group(q0, [0, 0, 0, 0]), group(q1, [1, 1, 1, 1]), group(q2, [1, 0, 1, 0])],
                   store_all=False)
    # only q2 (k = 2, inside 1..3) collects: its two correct responses
    assert stats == {"buffer/collected": 2.0, "buffer/duplicates": 0.0, "buffer/newly_retired": 1.0,
                     "buffer/stored_rollouts": 2.0, "buffer/pooled_zero_success": 0.0}  # q0 was not pooled
    assert pooled_texts(store, run, q2) == [f"{q2} answer 0 reward 1", f"{q2} answer 2 reward 1"]
    assert pooled_texts(store, run, q0) == pooled_texts(store, run, q1) == []


def test_collection_respects_configured_bounds_and_collect_flag(store):
    run, (q0, q1, q2, _) = new_run(store)
    # bounds 2..2: the k = 1 group collects nothing, the k = 2 group collects two
    stats = update(store, run, 0, [group(q0, [1, 0, 0, 0]), group(q1, [1, 1, 0, 0])], lo=2, hi=2)
    assert stats["buffer/collected"] == 2.0 and stats["buffer/stored_rollouts"] == 8.0  # store_all keeps the rest
    stats = update(store, run, 1, [group(q2, [1, 0, 0, 0])], collect=False)
    assert stats["buffer/collected"] == 0.0 and pooled_texts(store, run, q2) == []
    assert store.buffer_state(run, 4).bucket_counts == {0: 0, 1: 2, 2: 1, 3: 0, 4: 0}


def test_dedup_by_exact_text_within_group_and_against_pool(store):
    run, (q0, q1, _, _) = new_run(store)
    stats = update(store, run, 0, [group(q0, [1, 1, 0, 1], ["A", "A", "A", "B"])], store_all=False)
    # the second correct "A" is a duplicate; the wrong "A" is no candidate at all
    assert stats["buffer/collected"] == 2.0 and stats["buffer/duplicates"] == 1.0
    stats = update(store, run, 1, [group(q0, [1, 1, 1, 0], ["A", "a", "A ", "C"]),
                                   group(q1, [1, 0, 0, 0], ["A", "x", "y", "z"])], store_all=False)
    # "A" is already pooled for q0; "a" and "A " differ by exact text; q1's "A" is another question's
    assert stats["buffer/collected"] == 3.0 and stats["buffer/duplicates"] == 1.0
    assert pooled_texts(store, run, q0) == ["A", "A ", "B", "a"]
    assert pooled_texts(store, run, q1) == ["A"]


def test_retirement_takes_pool_trajectories_out_and_keeps_them(store):
    run, (q0, q1, _, _) = new_run(store)
    update(store, run, 0, [group(q0, [1, 1, 0, 0]), group(q1, [1, 0, 0, 0])])
    stats = update(store, run, 1, [group(q0, [1, 1, 1, 1])])
    assert stats["buffer/newly_retired"] == 1.0 and stats["buffer/collected"] == 0.0
    assert store.retired_uids(run) == {q0}
    assert pooled_texts(store, run, q0) == []
    state = store.buffer_state(run, 4)
    assert state.buckets == {1: [q1]} and state.retired_questions == 1 and state.pool_trajectories == 1
    assert state.bucket_counts[4] == 1  # retired questions still count in their bucket
    dump = dump_run(store, run)
    kept = [t for t in dump["trajectories"] if t[0] == q0 and t[3] > 0 and t[2] == 0]
    assert [(t[10], t[11]) for t in kept] == [(False, True), (False, True)]  # (in_pool, retired)
    # retirement is permanent: a later imperfect group neither un-retires nor pools again
    update(store, run, 2, [group(q0, [1, 0, 0, 0])])
    assert store.retired_uids(run) == {q0} and pooled_texts(store, run, q0) == []


def test_no_retirement_when_switched_off(store):
    run, (q0, _, _, _) = new_run(store)
    update(store, run, 0, [group(q0, [1, 0, 0, 0])])
    stats = update(store, run, 1, [group(q0, [1, 1, 1, 1])], retire=False)
    assert stats["buffer/newly_retired"] == 0.0 and store.retired_uids(run) == set()
    assert store.buffer_state(run, 4).buckets == {4: [q0]}  # still pooled, now in bucket k = 4


def test_question_moves_bucket_when_a_new_group_is_verified(store):
    run, (q0, q1, _, _) = new_run(store)
    update(store, run, 0, [group(q0, [1, 0, 0, 0]), group(q1, [1, 1, 0, 0])])
    assert store.buffer_state(run, 4).buckets == {1: [q0], 2: [q1]}
    update(store, run, 1, [group(q0, [1, 1, 1, 0])])
    state = store.buffer_state(run, 4)
    assert state.buckets == {2: [q1], 3: [q0]}
    assert state.bucket_counts == {0: 0, 1: 0, 2: 1, 3: 1, 4: 0} and state.pool_questions == 2


@pytest.mark.parametrize("keep0", [True, False])
def test_pooled_question_scoring_zero_keeps_its_bucket_as_the_authors_or_moves(store, keep0):
    """(code) the bucket update is skipped on 0 successes: the question stays drawable; counted either way."""
    run, (q0, q1, q2, _) = new_run(store)
    update(store, run, 0, [group(q0, [1, 0, 0, 0]), group(q1, [1, 1, 0, 0])])
    stats = update(store, run, 1, [group(q0, [0, 0, 0, 0]), group(q2, [0, 0, 0, 0])], keep0=keep0)
    assert stats["buffer/pooled_zero_success"] == 1.0  # q2 was never pooled
    state = store.buffer_state(run, 4)
    assert state.buckets == ({1: [q0], 2: [q1]} if keep0 else {0: [q0], 2: [q1]})
    assert state.pool_questions == 2 and state.bucket_counts[0] == (1 if keep0 else 2)  # q2 sits in bucket 0
    drawn = store.sample_replay_questions(run, 4, 2, {1: 1.0, 2: 1.0, 3: 1.0}, random.Random(0))
    assert sorted(drawn) == sorted([q0, q1] if keep0 else [q1])


def test_mixed_group_counts_the_replayed_trajectory_and_is_not_stored_again(store):
    run, (q0, _, _, _) = new_run(store)
    update(store, run, 0, [group(q0, [1, 0, 0, 0])])
    old = store.candidates(run, [q0], 1)[q0][0]
    replayed = rollout(q0, 1.0, old.text, step=0, replayed_from=old.id)
    g = GroupResult(q0, [replayed] + group(q0, [1, 1, 0], ["new", "new2", "w"], step=1).rollouts, is_replay=True)
    stats = update(store, run, 1, [g])
    assert stats["buffer/stored_rollouts"] == 3.0 and stats["buffer/duplicates"] == 0.0
    g = GroupResult(q0, group(q0, [1, 1, 1], ["x", "y", "z"], step=2).rollouts, is_replay=True, replayed=1)
    stats = update(store, run, 2, [g])  # k = 3 fresh + 1 replayed = K: retires
    assert stats["buffer/newly_retired"] == 1.0
    assert dump_run(store, run)["group_results"][-1] == (q0, 2, 4, 4, True)


def naive_buffer(history, K, lo, hi):
    """Reference: replay the rules over the groups one by one with plain Python containers."""
    latest, retired, pool = {}, set(), {}
    for uid, rewards, texts in history:
        k = sum(rewards)
        latest[uid] = k
        if k == K:
            retired.add(uid)
        if lo <= k <= hi and uid not in retired:
            pool.setdefault(uid, set()).update(t for r, t in zip(rewards, texts) if r)
    live = {u: p for u, p in pool.items() if u not in retired and p}
    buckets = {}
    for u in sorted(live):
        buckets.setdefault(latest[u], []).append(u)
    counts = {k: sum(1 for v in latest.values() if v == k) for k in range(K + 1)}
    return buckets, counts, len(live), sum(len(p) for p in live.values()), len(retired)


def test_buffer_state_matches_naive_count_on_random_data(store):
    K, rng = 4, random.Random(7)
    run, uids = new_run(store, n_questions=12, group_size=K)
    history = []
    for step in range(8):
        groups = []
        for uid in rng.sample(uids, 5):
            rewards = [int(rng.random() < 0.6) for _ in range(K)]
            texts = [f"t{rng.randint(0, 4)}" for _ in range(K)]
            groups.append(group(uid, rewards, texts, step))
            history.append((uid, rewards, texts))
        update(store, run, step, groups, lo=1, hi=3)
    state = store.buffer_state(run, K)
    buckets, counts, n_q, n_t, n_ret = naive_buffer(history, K, 1, 3)
    # members per bucket (their order is the slot order: tests/exgrpo_core/test_store_slots.py)
    assert ({k: sorted(v) for k, v in state.buckets.items()}, state.bucket_counts) == (buckets, counts)
    assert (state.pool_questions, state.pool_trajectories, state.retired_questions) == (n_q, n_t, n_ret)
    counts = store.buffer_state(run, K, with_buckets=False)  # what the per-step metrics read
    assert counts.buckets == {} and counts == type(state)(**{**state.__dict__, "buckets": {}})
    assert n_t > 0 and n_ret > 0  # the random data exercised both paths
    dump = dump_run(store, run)
    pooled = {u: sum(1 for t in dump["trajectories"] if t[0] == u and t[10]) for u in uids}
    assert {s[0]: s[7] for s in dump["question_states"]} == pooled  # the pool_size counter


def test_candidates_respect_before_step_and_decode_arrays(store):
    run, (q0, q1, _, _) = new_run(store)
    update(store, run, 0, [group(q0, [1, 0, 0, 0], ["s0", "w", "w2", "w3"], step=0)])
    update(store, run, 3, [group(q0, [1, 1, 0, 0], ["s0", "s3", "w", "w2"], step=3)])
    assert [e.text for e in store.candidates(run, [q0], 3)[q0]] == ["s0"]
    got = store.candidates(run, [q0, q1], 4)
    assert [e.text for e in got[q0]] == ["s0", "s3"] and got[q1] == []
    expected = rollout(q0, 1.0, "s3", step=3)
    e = got[q0][1]
    assert (e.step, e.response_ids, e.question_uid) == (3, expected.response_ids, q0)
    assert e.behaviour_logprobs == pytest.approx(expected.behaviour_logprobs, rel=1e-6)  # float32 storage
    with pytest.raises(StoreError, match="never registered"):
        store.candidates(run, ["nope"], 4)


def test_two_runs_in_one_database_never_see_each_others_experience(store):
    run_a, uids = new_run(store)
    run_b = run_a[::-1]
    store.start_run(run_b, "other", "tiny", {}, 4)
    store.register_questions(run_b, questions(uids, tag=run_a))  # the same shared question rows
    update(store, run_a, 0, [group(uids[0], [1, 0, 0, 0]), group(uids[1], [1, 1, 1, 1])])
    update(store, run_b, 0, [group(uids[0], [0, 0, 0, 0])])  # verified in B too, but nothing pooled there
    assert store.candidates(run_b, uids, 10) == {u: [] for u in uids}
    state_b = store.buffer_state(run_b, 4)
    assert (state_b.buckets, state_b.pool_trajectories, state_b.retired_questions) == ({}, 0, 0)
    assert store.buffer_state(run_a, 4).buckets == {1: [uids[0]]}
    assert store.retired_uids(run_b) == set() and store.retired_uids(run_a) == {uids[1]}
    tid = store.candidates(run_a, [uids[0]], 10)[uids[0]][0].id
    with pytest.raises(StoreError, match="not in run"):
        store.record_replays(run_b, 1, [(tid, 0.1)])


def test_record_replays_updates_counters(store):
    run, (q0, q1, _, _) = new_run(store)
    update(store, run, 0, [group(q0, [1, 1, 0, 0]), group(q1, [1, 0, 0, 0])])
    a, b = store.candidates(run, [q0], 1)[q0]
    c = store.candidates(run, [q1], 1)[q1][0]
    store.record_replays(run, 1, [(a.id, 0.3), (a.id, 0.2), (c.id, 0.1)])
    store.record_replays(run, 2, [(a.id, 0.4)])
    after = {e.id: e.times_replayed for e in store.candidates(run, [q0, q1], 3)[q0]}
    assert after == {a.id: 3, b.id: 0}
    traj = {t[7]: (t[12], t[13]) for t in dump_run(store, run)["trajectories"] if t[10]}
    assert traj[a.text] == (3, 2) and traj[b.text] == (0, None) and traj[c.text] == (1, 1)
    with store.engine.connect() as conn:
        times = dict(conn.execute(select(QuestionState.uid, QuestionState.times_replayed)
                                  .where(QuestionState.run_id == run)).all())
    assert times == {q0: 3, q1: 1, "q2": 0, "q3": 0}


def test_buffer_update_is_atomic(store, monkeypatch):
    run, (q0, q1, _, _) = new_run(store)
    update(store, run, 0, [group(q0, [1, 0, 0, 0])])
    before = dump_run(store, run)
    with pytest.raises(StoreError, match="never registered.*unknown"):
        update(store, run, 1, [group(q0, [1, 1, 1, 1]), group("unknown", [1, 0, 0, 0])])
    bad = group(q1, [1, 0, 0, 0])
    bad.rollouts[0].response_ids[0] = 2**40  # fails while encoding, after history and states were written
    with pytest.raises(StoreError, match="int32"):
        update(store, run, 1, [group(q0, [1, 1, 1, 1]), bad])
    assert dump_run(store, run) == before


def test_register_questions_is_idempotent_and_keeps_repeats_apart(store):
    run, uids = new_run(store, n_questions=3)
    qs = questions(uids, tag=run)
    store.register_questions(run, qs)  # resume: nothing new
    repeat = questions(["r0"], tag=run)[0]
    store.register_questions(run, [repeat, type(repeat)(uid="r1", messages=repeat.messages, answer="1")])
    store.register_questions(run, [type(repeat)(uid="r2", messages=repeat.messages, answer="1")])  # a later repeat
    update(store, run, 0, [group("r0", [1, 0, 0, 0]), group("r1", [0, 0, 0, 0]), group("r2", [1, 1, 0, 0])])
    assert store.buffer_state(run, 4).buckets == {1: ["r0"], 2: ["r2"]}  # three rows, three states
    changed = type(qs[0])(uid=uids[0], messages=qs[1].messages, answer="2")
    with pytest.raises(StoreError, match="already registered with other content"):
        store.register_questions(run, [changed])
    with pytest.raises(StoreError, match="unknown run id"):
        store.register_questions("no-such-run", qs)
