"""Replay sampling from the database (`ExperienceStore.sample_replay_questions`) against the
reference path `selection.sample_questions(buffer_state(...).buckets)`: same questions, same rng state
afterwards, on SQLite and PostgreSQL, including a PostgreSQL database whose default collation does not
sort by code point. Also migration 0004 both ways (0005: tests/exgrpo_core/test_store_slots.py).

Run: `.venv/bin/python -m pytest tests/exgrpo_core/test_store_sampling.py -q`.
"""

from __future__ import annotations

import dataclasses
import random
import uuid

import pytest
from alembic import command
from sqlalchemy import inspect, text
from store_helpers import BACKENDS, PG_URL, fresh_database, group, questions, store, update  # noqa: F401

from exgrpo_core.algorithm import selection
from exgrpo_core.store.experience_store import ExperienceStore, StoreError
from exgrpo_core.store.engine import _alembic_config, create_store_engine, parse_url, scratch_postgres_database

K = 4
# Mixed case, digits, punctuation and non-ASCII: code-point order differs from language collations
# ("Q1" < "_a" < "q1" < "q10" < "q2" by code point; "_a" < "q1" < "Q1" ... under ICU "en").
SPECIAL = ["Q1", "_a", "q1", "q10", "q2", "qé", "qe", "Z", "a b", "a-b", "ab", "Ωmega", "émile", "ß", "日本",
           "x😀", "x~", "10", "9", "A", "a"]


def mixed_uids(rng: random.Random, n: int) -> list[str]:
    stems = ["q", "Q", "_", "é", "Ω", "z", "", "a b"]
    out = set(SPECIAL)
    while len(out) < n:
        out.add(f"{rng.choice(stems)}{rng.randrange(1000)}")
    return sorted(out)


def random_buffer(s: ExperienceStore, rng: random.Random, n_questions: int, steps: int) -> str:
    """A run whose buffer went through `steps` random buffer updates (collect, move buckets, retire)."""
    run_id = uuid.uuid4().hex
    s.start_run(run_id, f"test-{run_id[:8]}", "tiny", {}, K)
    uids = mixed_uids(rng, n_questions)
    s.register_questions(run_id, questions(uids, tag=run_id))
    for step in range(steps):
        chosen = rng.sample(uids, rng.randrange(1, len(uids)))
        groups = [group(u, [int(rng.random() < p) for _ in range(K)], step=step)
                  for u in chosen for p in [rng.random()]]
        update(s, run_id, step, groups, group_size=K, retire=rng.random() < 0.7)
    return run_id


def random_weights(rng: random.Random) -> dict[int, float]:
    """Some buckets missing, some weighted 0, the rest random; sometimes the paper's Gaussian."""
    if rng.random() < 0.3:
        return selection.bucket_weights(K, "gaussian", 1.0, "count")
    return {k: rng.choice([0.0, 0.0, 0.01, 1.0, rng.random() * 5]) for k in range(-1, K + 2) if rng.random() < 0.8}


def check_same_as_reference(s: ExperienceStore, run_id: str, seeds: range) -> dict:
    """sample_replay_questions == sample_questions(buffer_state) for many seeds; returns coverage counts."""
    buckets = s.buffer_state(run_id, K).buckets
    pool = sum(len(v) for v in buckets.values())
    seen = {"exhausted": 0, "zero_weight_bucket": 0, "partial": 0}
    for seed in seeds:
        r = random.Random(seed)
        weights = random_weights(r)
        n = r.choice([0, 1, 3, pool // 2, pool, pool + 7])
        per_question = seed % 2 == 1
        ref_rng, db_rng = random.Random(seed * 31), random.Random(seed * 31)
        want = selection.sample_questions(buckets, n, weights, ref_rng, per_question)
        got = s.sample_replay_questions(run_id, K, n, weights, db_rng, per_question)
        assert got == want, f"seed {seed}, n {n}, weights {weights}"
        assert db_rng.getstate() == ref_rng.getstate(), f"seed {seed}: rng consumed differently"
        drawable = sum(len(v) for k, v in buckets.items() if weights.get(k, 0) > 0)
        seen["exhausted"] += n > drawable > 0 and len(got) == drawable
        seen["partial"] += 0 < n < drawable
        seen["zero_weight_bucket"] += any(buckets.get(k) and w == 0 for k, w in weights.items())
    return seen


def test_bucket_positions_replay_sample_questions_exactly():
    for seed in range(2000):
        r = random.Random(seed)
        buckets = {k: [f"u{k}.{j}" for j in range(r.randrange(0, 12))] for k in r.sample(range(-1, 10), r.randrange(8))}
        weights = {k: r.choice([0.0, 0.5, 1.0, 3.0]) for k in r.sample(range(10), r.randrange(10))}
        n = r.randrange(40)
        a, b = random.Random(seed), random.Random(seed)
        per_question = seed % 2 == 1
        want = selection.sample_questions(buckets, n, weights, a, per_question)
        picks = selection.sample_bucket_positions({k: len(v) for k, v in buckets.items()}, n, weights, b,
                                                  per_question)
        assert [buckets[k][i] for k, i in picks] == want and a.getstate() == b.getstate()


@pytest.mark.parametrize("counts, n, weights, match", [
    ({1: 3}, -1, {1: 1.0}, "n must be >= 0"),
    ({1: -2}, 1, {1: 1.0}, "bucket size for k=1"),
    ({1: 2.5}, 1, {1: 1.0}, "bucket size for k=1"),
    ({1: 3}, 1, {1: float("nan")}, "bucket weight for k=1"),
    ({1: 3}, 1, {2: -1.0}, "bucket weight for k=2"),
])
def test_bucket_positions_reject_bad_input(counts, n, weights, match):
    with pytest.raises(selection.SelectionError, match=match):
        selection.sample_bucket_positions(counts, n, weights, random.Random(0))


def test_sample_replay_questions_matches_reference_on_random_buffers(store):
    seen = {"exhausted": 0, "zero_weight_bucket": 0, "partial": 0}
    for b in range(4):
        rng = random.Random(100 + b)
        run_id = random_buffer(store, rng, n_questions=rng.choice([25, 60]), steps=rng.choice([2, 4]))
        assert len(store.buffer_state(run_id, K).buckets) >= 2  # the draw has buckets to choose between
        for key, v in check_same_as_reference(store, run_id, range(b * 50, b * 50 + 50)).items():
            seen[key] += v
    assert all(v > 0 for v in seen.values()), seen  # the seeds reached every case


def test_sample_replay_questions_on_an_empty_pool_and_bad_calls(store):
    run_id = random_buffer(store, random.Random(0), n_questions=5, steps=0)
    rng = random.Random(1)
    state = rng.getstate()
    assert store.sample_replay_questions(run_id, K, 10, {1: 1.0}, rng) == [] and rng.getstate() == state
    with pytest.raises(StoreError, match="unknown run id 'nope'"):
        store.sample_replay_questions("nope", K, 1, {1: 1.0}, rng)
    with pytest.raises(StoreError, match=f"group_size {K}, not 8"):
        store.sample_replay_questions(run_id, 8, 1, {1: 1.0}, rng)
    with pytest.raises(selection.SelectionError, match="n must be >= 0"):
        store.sample_replay_questions(run_id, K, -1, {1: 1.0}, rng)


def language_collated_database():
    """URL of a new PostgreSQL database whose default collation is ICU "en" (language order), dropped after."""
    return scratch_postgres_database(PG_URL, "exgrpo_icu", "TEMPLATE template0 LOCALE_PROVIDER icu "
                                     "ICU_LOCALE 'en' LOCALE 'C.UTF-8'")


@pytest.mark.postgres
def test_code_point_order_where_the_database_collation_sorts_otherwise():
    with language_collated_database() as url:
        s = ExperienceStore(url)
        try:
            with s.engine.connect() as c:
                default = c.execute(text("SELECT array_agg(x ORDER BY x) FROM unnest(CAST(:a AS text[])) x"),
                                    {"a": SPECIAL}).scalar_one()
            assert default != sorted(SPECIAL)  # this database would sort the uids differently
            first = random_buffer(s, random.Random(7), n_questions=40, steps=1)  # one step: joined in uid order
            assert all(v == sorted(v) for v in s.buffer_state(first, K).buckets.values())
            run_id = random_buffer(s, random.Random(7), n_questions=40, steps=3)
            check_same_as_reference(s, run_id, range(60))
        finally:
            s.close()


@pytest.fixture(params=BACKENDS)
def empty_url(request, tmp_path):
    yield from fresh_database(request.param, tmp_path, "exgrpo_sampling")


def test_migration_0004_down_and_up_keeps_rows_and_sampling(empty_url):
    s = ExperienceStore(empty_url)
    run_id = random_buffer(s, random.Random(3), n_questions=20, steps=2)
    want = s.buffer_state(run_id, K)
    s.close()
    cfg, engine = _alembic_config(), create_store_engine(parse_url(empty_url))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0003")
    names = {i["name"] for i in inspect(engine).get_indexes("question_states")}
    uid_col = {c["name"]: c for c in inspect(engine).get_columns("question_states")}["uid"]
    engine.dispose()
    assert "ix_question_states_run_pool_k_uid" not in names and uid_col["type"].collation in (None, "default")
    again = ExperienceStore(empty_url)  # upgrades to head: slots renumbered in uid order (0005)
    got = again.buffer_state(run_id, K)
    assert got.buckets == {k: sorted(v) for k, v in want.buckets.items()}
    assert dataclasses.replace(got, buckets={}) == dataclasses.replace(want, buckets={})
    check_same_as_reference(again, run_id, range(10))
    again.close()
