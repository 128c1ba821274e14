"""The experience database: runs, questions, per-run question state, trajectories, replays,
step metrics and evaluation results, on SQLite (default) or PostgreSQL.

`ExperienceStore` is the only door: records from `exgrpo_core.types` go in and out, never rows or
sessions. Each write method is one transaction, and every query filters on `run_id`, so runs sharing
a database never see each other's experience. The schema is brought to the Alembic head on open.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import random
from collections import Counter
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Connection, bindparam, case, delete, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from exgrpo_core.algorithm import age, selection
from exgrpo_core.store.codec import decode_logprobs, decode_token_ids
from exgrpo_core.store.buffer import (CollectRule, apply_groups, bulk_insert, chunks, none_if_nan, review_retired,
                                      read_buffer_state, states_by_uid)
from exgrpo_core.store.engine import (StoreError, create_store_engine, mask_url, parse_url, read_connection,
                                      resolve_db_url, upgrade_schema, write_transaction)
from exgrpo_core.store.tables import (EvalResult, GroupResultRow, QuestionRow, QuestionState, Replay, Run,
                                      StepMetric, Trajectory)
from exgrpo_core.store.rollback import rollback_rows
from exgrpo_core.store.replay import bucket_sizes, candidate_rows, payload_rows, pooled_newest, pooled_uids_at
from exgrpo_core.store.audit import AuditStore
from exgrpo_core.store.warm import WarmStartStore
from exgrpo_core.types import BufferState, Experience, GroupResult, Question

__all__ = ["ExperienceStore", "StoreError", "resolve_db_url", "question_digest"]

RUN_STATUSES = ("running", "finished", "failed", "stopped", "killed")  # stopped: by a monitor
_RUN_FIELDS = ("status", "step", "mlflow_run_id", "replay_active", "replay_started_step")


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _aware(t: datetime) -> datetime:
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)  # SQLite hands back naive UTC


def _float(key: str, v: Any) -> float | None:
    try:
        return none_if_nan(float(v))
    except (TypeError, ValueError) as e:
        raise StoreError(f"metric {key!r} is not a number: {v!r}") from e


def _messages_json(q: Question) -> str:
    return json.dumps(list(q.messages), ensure_ascii=False, sort_keys=True)


def question_digest(q: Question, repeat_of: str | None = None) -> str:
    """sha1 over (source, messages, answer): the identity of a question shared across runs.

    A dataset that repeats a question (e.g. avg@32 suites) gets one row per repeat: later copies
    are salted with their own uid (`repeat_of`), so each keeps its own per-run state.
    """
    parts = [q.source, list(q.messages), q.answer] + ([] if repeat_of is None else ["repeat", repeat_of])
    payload = json.dumps(parts, ensure_ascii=False, sort_keys=True)
    return hashlib.sha1(payload.encode("utf-8")).hexdigest()


class ExperienceStore(WarmStartStore, AuditStore):
    """Typed access to the experience database at `url` (see `resolve_db_url`); warm-start and
    verifier-audit methods come from store/warm.py and store/audit.py.

    Example:
        >>> store = ExperienceStore("sqlite:////tmp/run/experience.db")  # doctest: +SKIP
        >>> store.start_run(run_id, "demo", "tiny", cfg.model_dump(), group_size=8)  # doctest: +SKIP
    """

    def __init__(self, url: str):
        self.url = parse_url(url)
        self.engine = create_store_engine(self.url)
        try:
            self.revision = upgrade_schema(self.engine)
        except Exception:
            self.engine.dispose()
            raise

    def __repr__(self) -> str:
        return f"ExperienceStore({mask_url(self.url)!r})"

    def __enter__(self) -> "ExperienceStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def upgrade(self) -> str:
        """Alembic `upgrade head`; returns the head revision (`exgrpo db upgrade`)."""
        self.revision = upgrade_schema(self.engine)
        return self.revision

    def close(self) -> None:
        self.engine.dispose()

    def _dialect_insert(self, model):
        return pg_insert(model) if self.engine.dialect.name == "postgresql" else sqlite_insert(model)

    @staticmethod
    def _require_run(conn: Connection, run_id: str) -> None:
        if conn.execute(select(Run.id).where(Run.id == run_id)).first() is None:
            raise StoreError(f"unknown run id {run_id!r} (call start_run first)")

    # ---- runs -------------------------------------------------------------------------------------
    def start_run(self, run_id: str, name: str, preset: str, config: dict, group_size: int) -> bool:
        """Insert the run; True if new, False when `run_id` exists (resume; group_size must match)."""
        if not run_id or len(run_id) > 64:
            raise StoreError(f"run id must be 1-64 characters, got {run_id!r}")
        if group_size < 1:
            raise StoreError(f"group_size must be >= 1, got {group_size}")
        with write_transaction(self.engine, f"starting run {run_id}") as conn:
            old = conn.execute(select(Run.group_size).where(Run.id == run_id)).scalar_one_or_none()
            if old is not None:
                if old != group_size:
                    raise StoreError(f"run {run_id} was started with group_size {old}; cannot resume it with "
                                     f"group_size {group_size}")
                return False
            now = _now()
            conn.execute(insert(Run).values(
                id=run_id, name=name, preset=preset, created_at=now, updated_at=now, status="running", step=-1,
                group_size=group_size, config_json=json.dumps(config, sort_keys=True, default=str),
                mlflow_run_id=None, replay_active=False, replay_started_step=None, slots_logged_after=-1))
        return True

    def find_run_by_name(self, name: str) -> str | None:
        """The id of the most recently created run called `name`, or None."""
        with read_connection(self.engine, "finding a run") as conn:
            return conn.execute(select(Run.id).where(Run.name == name)
                                .order_by(Run.created_at.desc(), Run.id.desc()).limit(1)).scalar_one_or_none()

    def get_run(self, run_id: str) -> dict | None:
        """The run as a dict (its columns, `config` parsed from JSON), or None."""
        with read_connection(self.engine, "reading a run") as conn:
            row = conn.execute(select(Run.__table__).where(Run.id == run_id)).mappings().first()
        if row is None:
            return None
        out = dict(row)
        out.update(created_at=_aware(out["created_at"]), updated_at=_aware(out["updated_at"]),
                   replay_active=bool(out["replay_active"]), config=json.loads(out.pop("config_json")))
        return out

    def update_run(self, run_id: str, **fields) -> None:
        """Set any of status, step, mlflow_run_id, replay_active, replay_started_step."""
        unknown = sorted(set(fields) - set(_RUN_FIELDS))
        if unknown:
            raise StoreError(f"update_run got unknown fields {unknown}; allowed: {list(_RUN_FIELDS)}")
        if "status" in fields and fields["status"] not in RUN_STATUSES:
            raise StoreError(f"run status must be one of {RUN_STATUSES}, got {fields['status']!r}")
        with write_transaction(self.engine, f"updating run {run_id}") as conn:
            res = conn.execute(update(Run).where(Run.id == run_id).values(updated_at=_now(), **fields))
            if res.rowcount == 0:
                raise StoreError(f"unknown run id {run_id!r} (call start_run first)")

    # ---- questions and experience -----------------------------------------------------------------
    def register_questions(self, run_id: str, questions: list[Question]) -> None:
        """Upsert questions by digest and give each a state row in this run (idempotent, bulk)."""
        by_uid: dict[str, Question] = {}
        for q in questions:
            if by_uid.setdefault(q.uid, q) != q:
                raise StoreError(f"question uid {q.uid!r} appears twice with different content")
        with write_transaction(self.engine, f"registering questions of run {run_id}") as conn:
            self._require_run(conn, run_id)
            known = dict(conn.execute(select(QuestionState.uid, QuestionRow.digest)
                                      .join(QuestionRow, QuestionRow.id == QuestionState.question_id)
                                      .where(QuestionState.run_id == run_id)).all())
            used, rows = set(known.values()), []
            for uid, q in by_uid.items():
                plain, repeat = question_digest(q), question_digest(q, uid)
                if uid in known:  # resume: the uid must still name the same question
                    if known[uid] not in (plain, repeat):
                        raise StoreError(f"question uid {uid!r} of run {run_id} is already registered with "
                                         "other content (did the dataset change between resumes?)")
                    continue
                digest = repeat if plain in used else plain  # a repeated question gets its own row
                used.add(digest)
                rows.append(dict(digest=digest, uid=uid, source=q.source, text=q.text,
                                 messages_json=_messages_json(q), answer=q.answer))
            ids = self._upsert_questions(conn, rows)
            bulk_insert(conn, insert(QuestionState), [dict(
                run_id=run_id, question_id=ids[r["digest"]], uid=r["uid"], latest_k=None, n_groups=0,
                last_step=None, retired=False, retired_step=None, times_replayed=0, pool_size=0) for r in rows])

    def _upsert_questions(self, conn: Connection, rows: list[dict]) -> dict[str, int]:
        """Insert unseen questions (shared across runs); returns digest -> question id."""
        stmt = self._dialect_insert(QuestionRow).on_conflict_do_nothing(index_elements=["digest"])
        ids: dict[str, int] = {}
        for part in chunks(rows):
            bulk_insert(conn, stmt, part)
            ids.update(conn.execute(select(QuestionRow.digest, QuestionRow.id)
                                    .where(QuestionRow.digest.in_([r["digest"] for r in part]))).all())
        return ids

    def apply_buffer_update(self, run_id: str, step: int, groups: list[GroupResult], *, group_size: int,
                            collect: bool, collect_min_k: int, collect_max_k: int, retire: bool,
                            store_all: bool, keep_bucket_on_zero: bool = False) -> dict[str, float]:
        """ExGRPO §3.2 experience management for one step, all or nothing (docs/implementation_details.md).

        Every group is recorded in the history and moves its question to bucket k. Fresh correct
        responses of groups with collect_min_k <= k <= collect_max_k join the pool, de-duplicated by
        exact text; with `store_all` the other fresh responses are stored outside the pool. With
        `retire`, k == group_size retires the question and its experiences leave the pool (kept). With
        `keep_bucket_on_zero` (code) a pooled question whose group scores k = 0 keeps its bucket.

        Returns:
            {"buffer/collected", "buffer/duplicates", "buffer/newly_retired", "buffer/stored_rollouts",
            "buffer/pooled_zero_success"}: experiences stored, correct responses dropped as duplicates,
            questions retired, rows written, pooled questions whose group scored 0/K.
        """
        for g in groups:
            bad = [r.question_uid for r in g.rollouts if r.question_uid != g.question_uid]
            if bad:
                raise StoreError(f"group of question {g.question_uid!r} holds a rollout of question {bad[0]!r}")
        rule = CollectRule(group_size, collect, collect_min_k, collect_max_k, retire, store_all, keep_bucket_on_zero)
        with write_transaction(self.engine, f"buffer update of run {run_id} at step {step}") as conn:
            self._require_run(conn, run_id)
            return apply_groups(conn, run_id, step, groups, rule)

    def buffer_state(self, run_id: str, group_size: int, with_buckets: bool = True) -> BufferState:
        """Buckets of pooled questions by latest k, counts per k = 0..group_size, pool and retired sizes;
        `with_buckets=False`: the counts and sizes only (buckets left empty), one aggregate query."""
        with read_connection(self.engine, f"reading the buffer of run {run_id}") as conn:
            return read_buffer_state(conn, run_id, group_size, with_buckets)

    def sample_replay_questions(self, run_id: str, group_size: int, n: int, weights: dict[int, float],
                                rng: random.Random, per_question: bool = False) -> list[str]:
        """ExGRPO question sampling (docs/implementation_details.md): n pooled questions, bucket by w(Acc), uniform inside.

        Returns exactly `selection.sample_questions(self.buffer_state(run_id, group_size).buckets, n,
        weights, rng, per_question)`, with the same rng calls, but reads only the sizes of the buckets with a positive
        weight and the uids at the drawn slots: O(log pool) per bucket and per question.
        `group_size` must be the run's K; bad n or weights raise `selection.SelectionError` as there.
        The sizes and the uids are two statements: a writer changing this run's pool in between (none
        in the training loop) can make a chosen position vanish, which is a StoreError.
        """
        with read_connection(self.engine, f"sampling replay questions of run {run_id}") as conn:
            K = conn.execute(select(Run.group_size).where(Run.id == run_id)).scalar_one_or_none()
            if K is None:
                raise StoreError(f"unknown run id {run_id!r} (call start_run first)")
            if K != group_size:
                raise StoreError(f"run {run_id} has group_size {K}, not {group_size}")
            drawable = [k for k, w in weights.items() if isinstance(w, (int, float)) and w > 0]
            picks = selection.sample_bucket_positions(bucket_sizes(conn, run_id, drawable), n, weights, rng,
                                                      per_question)
            return pooled_uids_at(conn, run_id, picks)

    def sample_aged_replay_questions(self, run_id: str, n: int, weights: dict[int, float], rng: random.Random,
                                     step: int, per_question: bool = False, max_age: int | None = None,
                                     half_life: float | None = None) -> list[str]:
        """ExGRPO question sampling under the age rules (`age.sample_aged_questions`) at step `step`: reads every
        pooled question of the drawable buckets with its newest candidate's step (O(pool), not O(log pool))."""
        drawable = [k for k, w in weights.items() if isinstance(w, (int, float)) and w > 0]
        with read_connection(self.engine, f"sampling replay questions of run {run_id}") as conn:
            newest = pooled_newest(conn, run_id, drawable, step)
        buckets = {k: [(uid, step - s) for uid, s in members] for k, members in newest.items()}
        return age.sample_aged_questions(buckets, n, weights, rng, per_question, max_age, half_life)

    def candidates(self, run_id: str, question_uids: list[str], before_step: int,
                   payload: bool = True) -> dict[str, list[Experience]]:
        """Pooled trajectories of these questions generated before `before_step`, oldest first.

        Every requested uid is a key (an empty list when it has none); an unregistered uid is an error.
        With payload=False the behaviour log-probs and text are left None (selection scores only the
        token ids; `with_payloads` reads them for the chosen few).
        """
        out: dict[str, list[Experience]] = {uid: [] for uid in question_uids}
        with read_connection(self.engine, f"reading candidates of run {run_id}") as conn:
            for part in chunks(sorted(out)):
                rows = candidate_rows(conn, run_id, part, before_step, payload)
                missing = set(part) - {r[0] for r in rows}
                if missing:
                    raise StoreError(f"question uids never registered for run {run_id}: {sorted(missing)[:5]}")
                for uid, tid, ids, step, ent, times, *rest in rows:
                    if tid is not None:
                        out[uid].append(Experience(
                            id=tid, question_uid=uid, response_ids=decode_token_ids(ids), step=step,
                            entropy=math.nan if ent is None else ent, times_replayed=times,
                            behaviour_logprobs=decode_logprobs(rest[0]) if payload else None,
                            text=rest[1] if payload else None))
        return out

    def with_payloads(self, run_id: str, experiences: list[Experience]) -> list[Experience]:
        """The same experiences with their stored behaviour log-probs and text (one read by id)."""
        if not experiences:
            return []
        ids = sorted({e.id for e in experiences})
        found: dict[int, tuple] = {}
        with read_connection(self.engine, f"reading replayed trajectories of run {run_id}") as conn:
            for part in chunks(ids):
                found.update({tid: (lps, text, r) for tid, lps, text, r in payload_rows(conn, run_id, part)})
        missing = sorted(set(ids) - found.keys())
        if missing:
            raise StoreError(f"trajectory ids not in run {run_id}: {missing[:5]}")
        return [dataclasses.replace(e, behaviour_logprobs=decode_logprobs(found[e.id][0]), text=found[e.id][1],
                                    reward=float(found[e.id][2])) for e in experiences]

    def record_replays(self, run_id: str, step: int, replays: list[tuple[int, float]]) -> None:
        """Log replays (trajectory id, entropy under the current policy) and bump the replay counters."""
        if not replays:
            return
        per_traj = Counter(tid for tid, _ in replays)
        T, QS = Trajectory, QuestionState
        with write_transaction(self.engine, f"recording replays of run {run_id} at step {step}") as conn:
            qid_of: dict[int, int] = {}
            for part in chunks(sorted(per_traj)):  # by primary key only (SQLite scanned the run's step index)
                qid_of.update((tid, qid) for tid, qid, run in conn.execute(
                    select(T.id, T.question_id, T.run_id).where(T.id.in_(part))) if run == run_id)
            missing = sorted(per_traj.keys() - qid_of.keys())
            if missing:
                raise StoreError(f"trajectory ids not in run {run_id}: {missing[:5]}")
            bulk_insert(conn, insert(Replay), [
                dict(run_id=run_id, trajectory_id=tid, question_id=qid_of[tid], step=step,
                     entropy=none_if_nan(float(ent))) for tid, ent in replays])
            later = case((T.last_replayed_step.is_(None) | (T.last_replayed_step < step), step),
                         else_=T.last_replayed_step)
            conn.execute(update(T).where(T.id == bindparam("b_id")).values(
                times_replayed=T.times_replayed + bindparam("b_n"), last_replayed_step=later),
                [dict(b_id=tid, b_n=n) for tid, n in per_traj.items()])
            per_q = Counter()
            for tid, n in per_traj.items():
                per_q[qid_of[tid]] += n
            conn.execute(update(QS).where(QS.run_id == run_id, QS.question_id == bindparam("b_qid")).values(
                times_replayed=QS.times_replayed + bindparam("b_n")),
                [dict(b_qid=qid, b_n=n) for qid, n in per_q.items()])

    def review_retired(self, run_id: str, step: int, fraction: float, rng: random.Random) -> list[str]:
        """Retired-set review (paper Table 7) at `step`, all or nothing: ceil(fraction x |retired|) retired
        questions, drawn by `rng`, back in on-policy sampling and their experiences back in the pool
        (store.buffer.review_retired; a rollback before `step` retires them again). Returns their uids."""
        with write_transaction(self.engine, f"retired-set review of run {run_id} at step {step}") as conn:
            self._require_run(conn, run_id)
            return review_retired(conn, run_id, step, fraction, rng)

    def latest_buckets(self, run_id: str, uids: list[str]) -> dict[str, int | None]:
        """uid -> its bucket now (latest k; None before its first group), for these registered questions."""
        if not uids:
            return {}
        with read_connection(self.engine, f"reading buckets of run {run_id}") as conn:
            return {uid: st[2] for uid, st in states_by_uid(conn, run_id, set(uids)).items()}

    def retired_uids(self, run_id: str) -> set[str]:
        """Uids of the run's retired questions."""
        with read_connection(self.engine, f"reading retired questions of run {run_id}") as conn:
            return set(conn.execute(select(QuestionState.uid).where(
                QuestionState.run_id == run_id, QuestionState.retired.is_(True))).scalars())

    # ---- metrics, evaluation, resume --------------------------------------------------------------
    def log_metrics(self, run_id: str, step: int, metrics: dict[str, float]) -> None:
        """Upsert one step's metrics (NaN is stored as NULL and read back as NaN)."""
        if not metrics:
            return
        rows = [dict(run_id=run_id, step=step, key=k, value=_float(k, v)) for k, v in metrics.items()]
        stmt = self._dialect_insert(StepMetric)
        stmt = stmt.on_conflict_do_update(index_elements=["run_id", "step", "key"], set_={"value": stmt.excluded.value})
        with write_transaction(self.engine, f"logging metrics of run {run_id} at step {step}") as conn:
            self._require_run(conn, run_id)
            bulk_insert(conn, stmt, rows)

    def group_slots(self, run_id: str) -> dict[int, tuple[int, int]]:
        """{step: (group members incl. replayed slots, experiential groups)}: a step's rollout budget."""
        G = GroupResultRow
        out: dict[int, tuple[int, int]] = {}
        with read_connection(self.engine, f"reading group sizes of run {run_id}") as conn:
            for step, n, is_replay in conn.execute(select(G.step, G.n, G.is_replay).where(G.run_id == run_id)):
                slots, replay = out.get(step, (0, 0))
                out[step] = (slots + n, replay + int(is_replay))
        return dict(sorted(out.items()))

    def replay_buckets(self, run_id: str) -> dict[int, int]:
        """{k: experiential groups whose question's previous group had k correct}: the bucket each
        replayed question was drawn from (its latest k before that step's group)."""
        G = GroupResultRow
        last: dict[int, int] = {}
        out: dict[int, int] = {}
        with read_connection(self.engine, f"reading group history of run {run_id}") as conn:
            rows = conn.execute(select(G.step, G.question_id, G.k, G.is_replay).where(G.run_id == run_id)
                                .order_by(G.step, G.id))
            for _step, qid, k, is_replay in rows:
                if is_replay and qid in last:
                    out[last[qid]] = out.get(last[qid], 0) + 1
                last[qid] = k
        return dict(sorted(out.items()))

    def get_metrics(self, run_id: str, keys: list[str] | None = None) -> dict[str, list[tuple[int, float]]]:
        """{key: [(step, value), ...]} in step order, for all keys or only `keys`."""
        q = select(StepMetric.key, StepMetric.step, StepMetric.value).where(StepMetric.run_id == run_id)
        if keys is not None:
            q = q.where(StepMetric.key.in_(keys))
        out: dict[str, list[tuple[int, float]]] = {}
        with read_connection(self.engine, f"reading metrics of run {run_id}") as conn:
            for key, step, value in conn.execute(q.order_by(StepMetric.key, StepMetric.step)):
                out.setdefault(key, []).append((step, math.nan if value is None else value))
        return out

    def save_eval(self, run_id: str, step: int, benchmark: str, metrics: dict[str, float], n: int) -> None:
        """One row per metric of an evaluation of `benchmark` (n questions) at `step`.

        Replaces an earlier evaluation of the same (run, step, benchmark), so re-evaluating a step
        (a resumed run, a repeated `exgrpo evaluate`) never duplicates rows.
        """
        now = _now()
        rows = [dict(run_id=run_id, step=step, benchmark=benchmark, metric=k, value=_float(k, v), n=n,
                     created_at=now) for k, v in metrics.items()]
        with write_transaction(self.engine, f"saving evaluation of run {run_id} at step {step}") as conn:
            self._require_run(conn, run_id)
            conn.execute(delete(EvalResult).where(EvalResult.run_id == run_id, EvalResult.step == step,
                                                  EvalResult.benchmark == benchmark))
            if rows:
                bulk_insert(conn, insert(EvalResult), rows)

    def get_evals(self, run_id: str) -> list[dict]:
        """The run's evaluations in (step, benchmark) order: [{step, benchmark, metrics: {name: value}, n}]."""
        E = EvalResult
        q = (select(E.step, E.benchmark, E.metric, E.value, E.n).where(E.run_id == run_id)
             .order_by(E.step, E.benchmark, E.metric))
        out: dict[tuple[int, str], dict] = {}
        with read_connection(self.engine, f"reading evaluations of run {run_id}") as conn:
            for step, bench, metric, value, n in conn.execute(q):
                row = out.setdefault((step, bench), {"step": step, "benchmark": bench, "metrics": {}, "n": n})
                row["metrics"][metric] = math.nan if value is None else value
        return list(out.values())

    def rollback_to(self, run_id: str, step: int) -> dict[str, int]:
        """Return the run's experience to the end of `step` (resume from a checkpoint), in one transaction.

        Deletes group results, trajectories, replays, step metrics and evaluations after `step`;
        rebuilds question states and replay counters from what remains; sets the run's step, and
        switches replay off again if it started after `step`. Returns rows deleted per table.
        """
        with write_transaction(self.engine, f"rolling back run {run_id} to step {step}") as conn:
            self._require_run(conn, run_id)
            deleted = rollback_rows(conn, run_id, step)
            started_later = Run.replay_started_step > step
            conn.execute(update(Run).where(Run.id == run_id).values(
                step=step, updated_at=_now(),
                slots_logged_after=case((Run.slots_logged_after > step, step), else_=Run.slots_logged_after),
                replay_active=case((started_later, False), else_=Run.replay_active),
                replay_started_step=case((started_later, None), else_=Run.replay_started_step)))
        return deleted
