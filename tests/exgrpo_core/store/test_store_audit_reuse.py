"""Migration 0006 on both backends: audit fields stored per trajectory (old rows stay valid), reward
changes applied in one transaction with a record, and a warm-started pool that rollback keeps while
the source run's rows stay untouched."""

from __future__ import annotations

import dataclasses
import hashlib
import random
import uuid

import pytest
from alembic import command
from sqlalchemy import select, text
from store_helpers import BACKENDS, dump_run, fresh_database, group, questions, store, update  # noqa: F401

from exgrpo_core.store.engine import _alembic_config, create_store_engine, head_revision, parse_url
from exgrpo_core.store.experience_store import ExperienceStore, StoreError
from exgrpo_core.store.tables import QuestionState, Trajectory

K = 4


@pytest.fixture(params=BACKENDS)
def empty_url(request, tmp_path):
    yield from fresh_database(request.param, tmp_path, "exgrpo_audit")


def _migrate(url: str, revision: str, down: bool) -> None:
    cfg, engine = _alembic_config(), create_store_engine(parse_url(url))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        (command.downgrade if down else command.upgrade)(cfg, revision)
    engine.dispose()


def audited(g, version="v1"):
    """The group with audit fields on each rollout, as loop.verify records them."""
    for r in g.rollouts:
        r.prediction, r.gold, r.verifier, r.verifier_version = r.text[-1], "$1$", "math", version
        r.reason = "correct" if r.reward > 0 else "timeout"
    return g


def start(s, uids, tag, name="run"):
    run_id = uuid.uuid4().hex
    s.start_run(run_id, f"{name}-{run_id[:6]}", "tiny", {}, K)
    s.register_questions(run_id, questions(uids, tag))
    return run_id


def play(s, run_id, uids, steps, seed=0, version="v1"):
    rng = random.Random(seed)
    for step in range(steps):
        groups = [audited(group(u, [rng.random() < 0.5 for _ in range(K)], step=step), version) for u in uids[:6]]
        update(s, run_id, step, groups, group_size=K, hi=K - 1)


def digest(s, run_id) -> str:
    return hashlib.sha256(repr(dump_run(s, run_id)).encode()).hexdigest()


def test_audit_fields_are_stored_and_old_rows_stay_valid_across_0006(empty_url):
    s = ExperienceStore(empty_url)
    uids, tag = [f"q{i}" for i in range(6)], uuid.uuid4().hex
    old = start(s, uids, tag)
    s.close()
    _migrate(empty_url, "0005", down=True)
    engine = create_store_engine(parse_url(empty_url))
    with engine.begin() as c:  # a row written by the previous release
        qid = c.execute(text("SELECT question_id FROM question_states WHERE run_id = :r"), {"r": old}).first()[0]
        c.execute(text("INSERT INTO trajectories (run_id, question_id, step, collected_step, reward, entropy, length, "
                       "truncated, text, text_sha1, token_ids, behaviour_logprobs, in_pool, retired, times_replayed) "
                       "VALUES (:r, :q, 0, 0, 1.0, 0.5, 1, false, 'x 1', 'h', :b, :b, false, false, 0)"),
                  {"r": old, "q": qid, "b": b"\0\0\0\0"})
    engine.dispose()
    s = ExperienceStore(empty_url)  # upgrades to head (0006 and later)
    assert s.revision == head_revision()
    row = s.stored_trajectories(old)[0]
    assert row["reward"] == 1.0 and all(row[f] is None for f in ("prediction", "gold", "verifier", "verifier_version",
                                                                 "verify_timed_out", "verify_reason"))
    run_id = start(s, uids, tag)
    play(s, run_id, uids, 1)
    rows = s.stored_trajectories(run_id)
    assert rows and {(r["verifier"], r["verifier_version"]) for r in rows} == {("math", "v1")}
    assert all(r["verify_timed_out"] == (r["reward"] == 0) for r in rows)
    assert all(r["prediction"] == r["text"][-1] and r["gold"] == "$1$" for r in rows)
    s.close()
    _migrate(empty_url, "0005", down=True)  # and back: the rows stay
    engine = create_store_engine(parse_url(empty_url))
    with engine.connect() as c:
        assert c.execute(text("SELECT count(*) FROM trajectories WHERE run_id = :r"), {"r": run_id}).scalar() == len(rows)
    engine.dispose()


def test_reward_changes_are_applied_in_one_transaction_with_a_record(store):
    uids = [f"q{i}" for i in range(6)]
    run_id = start(store, uids, uuid.uuid4().hex)
    play(store, run_id, uids, 3)
    store.update_run(run_id, step=2)
    rows = store.stored_trajectories(run_id)
    pooled = [r for r in rows if r["in_pool"]]
    wrong = [r for r in rows if r["reward"] == 0][:2]
    assert pooled and wrong
    victim = pooled[0]
    others = [r for r in pooled if r["uid"] == victim["uid"] and r["id"] != victim["id"]]
    fields = dict(prediction="7", gold="$7$", verifier="math", verifier_version="v2", verify_timed_out=False,
                  verify_reason="wrong")
    changes = [dict(id=victim["id"], old=1.0, new=0.0, **fields)] + [
        dict(id=r["id"], old=0.0, new=1.0, **{**fields, "verify_reason": "correct"}) for r in wrong]
    with pytest.raises(StoreError, match="changed since they were graded"):  # stale: nothing written
        store.apply_reward_changes(run_id, [dict(changes[0], old=0.0)] + changes[1:])
    assert store.reward_changes(run_id) == [] and store.stored_trajectories(run_id) == rows
    assert store.apply_reward_changes(run_id, changes) == {"changed": 3, "left_pool": 1}
    after = {r["id"]: r for r in store.stored_trajectories(run_id)}
    assert after[victim["id"]]["reward"] == 0.0 and not after[victim["id"]]["in_pool"]
    assert after[victim["id"]]["verifier_version"] == "v2" and after[victim["id"]]["prediction"] == "7"
    assert all(after[r["id"]]["reward"] == 1.0 and not after[r["id"]]["in_pool"] for r in wrong)
    log = store.reward_changes(run_id)
    assert [(c["trajectory_id"], c["old_reward"], c["new_reward"], c["verifier_version"]) for c in log] == [
        (c["id"], c["old"], c["new"], "v2") for c in changes]
    state = store.buffer_state(run_id, K)
    in_buckets = {u for members in state.buckets.values() for u in members}
    assert (victim["uid"] in in_buckets) == bool(others)  # the question left the pool with its last trajectory
    with store.engine.connect() as c:
        size = c.execute(select(QuestionState.pool_size).where(QuestionState.run_id == run_id,
                                                              QuestionState.uid == victim["uid"])).scalar_one()
    assert size == len(others)


def test_warm_start_copies_the_pool_once_keeps_the_source_and_survives_rollback(store):
    uids, tag = [f"q{i}" for i in range(8)], uuid.uuid4().hex
    src = start(store, uids, tag, "source")
    play(store, src, uids, 4, seed=1)
    store.update_run(src, step=3, status="finished")
    play_old = [r for r in store.stored_trajectories(src) if r["in_pool"]]
    before = digest(store, src)
    dst = start(store, uids, tag, "warm")
    everything = store.pool_export(src)
    young = store.pool_export(src, max_age=1)
    assert 0 < len(young["trajectories"]) < len(everything["trajectories"]) == len(play_old)
    assert all(t["step"] >= -2 for t in young["trajectories"])  # sampled at steps 2..3: step - 3 - 1
    assert store.pool_export(src, versions={"v0"})["trajectories"] == []
    counts = store.seed_pool(dst, [everything], {"sources": [src]})
    assert counts == {"trajectories": len(play_old), "questions": len(everything["buckets"])}
    assert store.seed_pool(dst, [everything], {"sources": [src]}) is None  # never twice
    assert digest(store, src) == before  # the source is only read
    seeded = store.buffer_state(dst, K)
    source_state = store.buffer_state(src, K)
    assert {k: sorted(v) for k, v in seeded.buckets.items()} == {k: sorted(v) for k, v in source_state.buckets.items()}
    with store.engine.connect() as c:
        rows = c.execute(select(Trajectory.behaviour_logprobs, Trajectory.token_ids, Trajectory.collected_step,
                                Trajectory.origin_run_id, Trajectory.origin_trajectory_id)
                         .where(Trajectory.run_id == dst)).all()
        origin = dict(c.execute(select(Trajectory.id, Trajectory.behaviour_logprobs)
                                .where(Trajectory.run_id == src)).all())
    assert all(cs == -1 and run == src and origin[tid] == lp for lp, _, cs, run, tid in rows)
    cands = store.candidates(dst, sorted(everything_uids(seeded)), before_step=0)
    assert sum(len(v) for v in cands.values()) == len(play_old)
    at_start = dump_run(store, dst)
    play(store, dst, uids, 3, seed=2)
    store.rollback_to(dst, -1)  # killed before the first checkpoint: the seeded pool stays as it was
    assert dump_run(store, dst) == at_start


def everything_uids(state) -> set[str]:
    return {u for members in state.buckets.values() for u in members}


def test_seed_skips_questions_the_new_run_does_not_have(store):
    uids, tag = [f"q{i}" for i in range(8)], uuid.uuid4().hex
    src = start(store, uids, tag, "source")
    play(store, src, uids, 3, seed=5)
    export = store.pool_export(src)
    dst = start(store, uids[:3], tag, "subset")
    counts = store.seed_pool(dst, [export], {})
    kept = [t for t in export["trajectories"] if t["digest"] in store.question_digests(dst)]
    assert counts["trajectories"] == len(kept)
    assert everything_uids(store.buffer_state(dst, K)) <= set(uids[:3])
    assert dataclasses.asdict(store.buffer_state(src, K))  # the source still reads
