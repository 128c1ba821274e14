"""Shared pieces of the experience-store tests: the two-backend `store` fixture, record builders, dumps.

PostgreSQL runs against EXGRPO_TEST_PG_URL (default: trust-auth postgres on 127.0.0.1:5432, database
`test`); those params carry `pytest.mark.postgres` and fail, never skip, when the server is down.
Tests isolate themselves there with fresh run ids and question texts (the questions table is shared).
"""

from __future__ import annotations

import os
import uuid
import zlib

import pytest
from sqlalchemy import select

from exgrpo_core.store.experience_store import ExperienceStore, StoreError
from exgrpo_core.store.engine import scratch_postgres_database
from exgrpo_core.store.tables import (EvalResult, GroupResultRow, QuestionState, Replay, Run, StepMetric,
                                      Trajectory)
from exgrpo_core.types import GroupResult, Question, Rollout

PG_URL = os.environ.get("EXGRPO_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
BACKENDS = [pytest.param("sqlite", id="sqlite"), pytest.param("postgres", id="postgres", marks=pytest.mark.postgres)]


def fresh_database(backend: str, tmp_path, prefix: str):
    """Generator for a fixture: URL of a new SQLite file, or a new PostgreSQL database dropped afterwards."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / (prefix + '.db')}"
        return
    with scratch_postgres_database(PG_URL, prefix) as url:
        yield url


def backend_url(backend: str, tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'experience.db'}" if backend == "sqlite" else PG_URL


@pytest.fixture(params=BACKENDS)
def store(request, tmp_path):
    """An ExperienceStore on SQLite (fresh file) or on the shared PostgreSQL test database."""
    try:
        s = ExperienceStore(backend_url(request.param, tmp_path))
    except StoreError as e:
        if request.param == "sqlite":
            raise
        pytest.fail(f"{e}\nThe postgres tests need this server (start it: pg_ctlcluster --skip-systemctl-redirect "
                    "$(ls /etc/postgresql) main start), or set EXGRPO_TEST_PG_URL.", pytrace=False)
    yield s
    s.close()


def new_run(store: ExperienceStore, n_questions: int = 4, group_size: int = 4) -> tuple[str, list[str]]:
    """Start a run with `n_questions` questions unique to it; returns (run_id, uids)."""
    run_id = uuid.uuid4().hex
    store.start_run(run_id, f"test-{run_id[:8]}", "tiny", {"seed": 0}, group_size)
    uids = [f"q{i}" for i in range(n_questions)]
    store.register_questions(run_id, questions(uids, tag=run_id))
    return run_id, uids


def questions(uids: list[str], tag: str) -> list[Question]:
    return [Question(uid=u, messages=({"role": "user", "content": f"What is {u}? [{tag}]"},), answer="1")
            for u in uids]


def rollout(uid: str, reward: float, text: str, step: int = 0, n_tokens: int = 3, **kw) -> Rollout:
    ids = [(zlib.crc32(text.encode()) + i) % 50_000 for i in range(n_tokens)]
    return Rollout(question_uid=uid, prompt_ids=[1, 2], response_ids=ids,
                   behaviour_logprobs=[-0.5 - i / 8 for i in range(n_tokens)], text=text, truncated=False,
                   step=step, reward=reward, entropy=0.25 + n_tokens / 16, **kw)


def group(uid: str, rewards: list[int], texts: list[str] | None = None, step: int = 0) -> GroupResult:
    """A fresh group of len(rewards) rollouts; default texts are all distinct."""
    texts = texts or [f"{uid} answer {i} reward {r}" for i, r in enumerate(rewards)]
    return GroupResult(uid, [rollout(uid, float(r), t, step) for r, t in zip(rewards, texts)])


def update(store, run_id, step, groups, group_size=4, collect=True, lo=1, hi=3, retire=True, store_all=True,
           keep0=False):
    return store.apply_buffer_update(run_id, step, groups, group_size=group_size, collect=collect, collect_min_k=lo,
                                     collect_max_k=hi, retire=retire, store_all=store_all, keep_bucket_on_zero=keep0)


def dump_run(store: ExperienceStore, run_id: str) -> dict[str, list[tuple]]:
    """Every row of a run without surrogate ids (trajectories keyed by content), sorted: comparable across runs."""
    QS, T, R = QuestionState, Trajectory, Replay
    with store.engine.connect() as c:
        uid = dict(c.execute(select(QS.question_id, QS.uid).where(QS.run_id == run_id)).all())
        traj_key = {tid: (uid[q], text, cs) for tid, q, text, cs in c.execute(
            select(T.id, T.question_id, T.text, T.collected_step).where(T.run_id == run_id))}

        def rows(stmt, fn=tuple):
            return sorted((fn(r) for r in c.execute(stmt)), key=repr)

        return {
            "runs": rows(select(Run.step, Run.status, Run.group_size, Run.config_json, Run.replay_active,
                                Run.replay_started_step).where(Run.id == run_id)),
            "question_states": rows(select(QS.uid, QS.latest_k, QS.n_groups, QS.last_step, QS.retired,
                                           QS.retired_step, QS.times_replayed, QS.pool_size, QS.slot)
                                    .where(QS.run_id == run_id)),
            "group_results": rows(select(GroupResultRow.question_id, GroupResultRow.step, GroupResultRow.k,
                                         GroupResultRow.n, GroupResultRow.is_replay)
                                  .where(GroupResultRow.run_id == run_id), lambda r: (uid[r[0]], *r[1:])),
            "trajectories": rows(select(T.question_id, T.step, T.collected_step, T.reward, T.entropy, T.length,
                                        T.truncated, T.text, T.token_ids, T.behaviour_logprobs, T.in_pool,
                                        T.retired, T.times_replayed, T.last_replayed_step)
                                 .where(T.run_id == run_id), lambda r: (uid[r[0]], *r[1:])),
            "replays": rows(select(R.trajectory_id, R.question_id, R.step, R.entropy).where(R.run_id == run_id),
                            lambda r: (traj_key[r[0]], uid[r[1]], *r[2:])),
            "step_metrics": rows(select(StepMetric.step, StepMetric.key, StepMetric.value)
                                 .where(StepMetric.run_id == run_id)),
            "eval_results": rows(select(EvalResult.step, EvalResult.benchmark, EvalResult.metric, EvalResult.value,
                                        EvalResult.n).where(EvalResult.run_id == run_id)),
        }
