"""rollback_to: a run rolled back to step s equals, row for row, a run that stopped after step s."""

from __future__ import annotations

import random

import pytest
from store_helpers import dump_run, group, questions, store, update  # noqa: F401

from exgrpo_core.store.experience_store import StoreError

K = 4
UIDS = [f"q{i}" for i in range(6)]


def play_step(store, run_id: str, step: int) -> None:
    """One deterministic iteration: buffer update, replays, metrics, evaluation, run bookkeeping.

    q0 is pooled at step 0 (k = 2) and retired at step 3 (k = K), so rolling back past 3 must
    put its experiences back into the pool; replays from step 1 on exercise the counters.
    """
    rng = random.Random(step)
    chosen = rng.sample(UIDS[1:], 3) + (["q0"] if step in (0, 3) else [])
    groups = []
    for uid in chosen:
        k = {0: 2, 3: K}[step] if uid == "q0" else rng.randint(0, K)
        rewards = [1] * k + [0] * (K - k)
        rng.shuffle(rewards)
        groups.append(group(uid, rewards, [f"{uid} t{rng.randint(0, 5)}" for _ in rewards], step))
    update(store, run_id, step, groups, retire=True, store_all=True)
    if step >= 1:
        cands = store.candidates(run_id, UIDS, before_step=step)
        picks = [(c[0].id, 0.1 * step) for _, c in sorted(cands.items()) if c][:2]
        store.record_replays(run_id, step, picks + picks[:1])
    store.log_metrics(run_id, step, {"rollout/reward_mean": step / 10, "loss/total": -step})
    store.save_eval(run_id, step, "gsm8k", {"pass1": step / 20}, n=8)
    store.update_run(run_id, step=step)
    if step == 3:
        store.update_run(run_id, replay_active=True, replay_started_step=3)


def start(store, tag: str) -> str:
    run_id = f"{tag}-{random.Random().getrandbits(64):016x}"
    store.start_run(run_id, run_id, "tiny", {"seed": 0}, K)
    return run_id


def test_rollback_restores_the_exact_state_of_a_run_stopped_at_that_step(store):
    tag = start(store, "tag")  # only to give this test's questions unique text on a shared database
    stopped, rolled = start(store, "stopped"), start(store, "rolled")
    for run_id in (stopped, rolled):
        store.register_questions(run_id, questions(UIDS, tag=tag))
    for step in range(3):
        play_step(store, stopped, step)
    for step in range(5):
        play_step(store, rolled, step)
    before = dump_run(store, rolled)
    assert before != dump_run(store, stopped)
    assert any(s[0] == "q0" and s[4] for s in before["question_states"])  # q0 retired at step 3
    deleted = store.rollback_to(rolled, 2)
    after = dump_run(store, rolled)
    assert after == dump_run(store, stopped)
    assert set(deleted) == {"group_results", "trajectories", "replays", "step_metrics", "eval_results"}
    assert deleted == {name: len(before[name]) - len(after[name]) for name in deleted}
    assert min(deleted.values()) > 0
    # and the run continues from there like the stopped one
    play_step(store, rolled, 3)
    play_step(store, stopped, 3)
    assert dump_run(store, rolled) == dump_run(store, stopped)


def test_rollback_to_before_the_first_step_empties_the_run(store):
    run_id = start(store, "empty")
    store.register_questions(run_id, questions(UIDS, tag=run_id))
    fresh = dump_run(store, run_id)
    for step in range(2):
        play_step(store, run_id, step)
    store.rollback_to(run_id, -1)
    after = dump_run(store, run_id)
    assert after["runs"][0][0] == -1
    assert {k: v for k, v in after.items() if k != "runs"} == {k: v for k, v in fresh.items() if k != "runs"}
    with pytest.raises(StoreError, match="unknown run id"):
        store.rollback_to("missing", 0)
