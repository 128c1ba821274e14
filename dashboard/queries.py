"""Every query the dashboard runs, in SQLAlchemy Core over `exgrpo_core.store.tables` tables.

Plain functions of a database URL returning pandas frames, so pages can cache them
(`st.cache_data`) and the benchmark can time them. Rules that keep pages fast on a database with
millions of trajectories: aggregate in SQL (GROUP BY, COUNT, fixed-width histogram bins), filter on
the indexed (run_id, step) / (run_id, question_id) prefixes, and page through rows (LIMIT/OFFSET);
no query returns all of a run's trajectories. All reads go through `dashboard.db.readonly_engine`.

Steps: the database stores 0-based step indices; every frame here carries step numbers instead (the
updates done, metrics.step_number: MLflow's steps and the checkpoint names), and step arguments are
step numbers too, so pages never see an index.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import pandas as pd
from sqlalchemy import Connection, Integer, and_, case, cast, func, literal, or_, select, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import aliased

from exgrpo_core import metrics as M
from exgrpo_core.algorithm.selection import PER_QUESTION, SelectionError, bucket_weights
from exgrpo_core.config.schema import SelectionConfig
from exgrpo_core.store.engine import mask_url
from exgrpo_core.store.tables import (EvalResult, GroupResultRow, QuestionRow, QuestionState, Replay, Run,
                                      StepMetric, Trajectory)
from dashboard.db import DashboardError, has_schema, readonly_engine, reason

RUN_KEYS = (M.REWARD_MEAN, M.FRESH_PASS1, M.BUFFER_QUESTIONS, M.BUFFER_TRAJECTORIES, M.RETIRED_QUESTIONS)
BIN_WIDTH = 0.02  # nats: fine SQL bins, merged into display bins by the page
PAGE_SIZE = 50
ENTROPY_DEFAULT_STEPS = 20  # the Entropy page opens on the last 20 steps (~20k trajectories at the paper batch)
_HAS_SCHEMA: set[str] = set()


@contextmanager
def reading(url: str, what: str) -> Iterator[Connection | None]:
    """One short read transaction (None when training has not created the tables yet)."""
    engine = readonly_engine(url)
    try:
        if url not in _HAS_SCHEMA:
            if not has_schema(engine):
                yield None
                return
            _HAS_SCHEMA.add(url)  # tables, once created by training, stay
        with engine.connect() as conn, conn.begin():
            yield conn
    except SQLAlchemyError as e:
        raise DashboardError(f"reading {what} from {mask_url(engine.url)} failed: {reason(e)}") from None


def _frame(conn: Connection | None, stmt, columns: list[str]) -> pd.DataFrame:
    if conn is None:
        return pd.DataFrame(columns=columns)
    return pd.DataFrame(conn.execute(stmt).all(), columns=columns)


def numbered(df: pd.DataFrame, *columns: str) -> pd.DataFrame:
    """Stored 0-based step indices -> the step numbers pages show (metrics.step_number); missing stays NaN."""
    for c in columns:
        df[c] = M.step_number(pd.to_numeric(df[c]))
    return df


def index_of(step: int) -> int:
    """The stored 0-based index of step number `step` (a page's step argument)."""
    return step - M.step_number(0)


# ---- runs -------------------------------------------------------------------------------------------
def list_runs(url: str) -> pd.DataFrame:
    """Every run, newest first, with the key metrics of its last completed step as columns."""
    cols = ["id", "name", "preset", "status", "step", "group_size", "replay_active", "replay_started_step",
            "created_at", "updated_at", "mlflow_run_id"]
    with reading(url, "runs") as conn:
        runs = _frame(conn, select(*(getattr(Run, c) for c in cols)).order_by(Run.created_at.desc(), Run.id), cols)
        last = _frame(conn, select(StepMetric.run_id, StepMetric.key, StepMetric.value)
                      .join(Run, and_(Run.id == StepMetric.run_id, Run.step == StepMetric.step))
                      .where(StepMetric.key.in_(RUN_KEYS)), ["id", "key", "value"])
    numbered(runs, "step", "replay_started_step")  # step: the last completed step's number = steps done
    runs["replay_active"] = runs["replay_active"].astype(bool)
    wide = last.pivot(index="id", columns="key", values="value") if len(last) else pd.DataFrame(index=runs["id"])
    for key in RUN_KEYS:
        runs[key] = runs["id"].map(wide[key]) if key in wide else float("nan")
    return runs


def metric_series(url: str, run_ids: tuple[str, ...], keys: tuple[str, ...]) -> pd.DataFrame:
    """Per-step metrics [run_id, step, key, value] of the runs, for the given keys."""
    stmt = (select(StepMetric.run_id, StepMetric.step, StepMetric.key, StepMetric.value)
            .where(StepMetric.run_id.in_(run_ids), StepMetric.key.in_(keys))
            .order_by(StepMetric.run_id, StepMetric.key, StepMetric.step))
    with reading(url, "step metrics") as conn:
        return numbered(_frame(conn, stmt, ["run_id", "step", "key", "value"]), "step")


def metric_keys(url: str, run_ids: tuple[str, ...]) -> list[str]:
    """Every step-metric key the runs logged, sorted."""
    stmt = select(StepMetric.key).where(StepMetric.run_id.in_(run_ids)).distinct().order_by(StepMetric.key)
    with reading(url, "metric names") as conn:
        return [] if conn is None else [k for (k,) in conn.execute(stmt)]


def buffer_now(url: str, run_id: str) -> pd.DataFrame:
    """Question states by latest k right now: [k, questions, retired, pooled, trajectories]; k NaN = unseen."""
    qs = QuestionState
    stmt = (select(qs.latest_k, func.count(), func.sum(case((qs.retired.is_(True), 1), else_=0)),
                   func.sum(case((and_(qs.retired.is_(False), qs.pool_size > 0), 1), else_=0)), func.sum(qs.pool_size))
            .where(qs.run_id == run_id).group_by(qs.latest_k).order_by(qs.latest_k))
    with reading(url, "the buffer") as conn:
        return _frame(conn, stmt, ["k", "questions", "retired", "pooled", "trajectories"])


def replay_buckets(url: str, run_id: str) -> pd.DataFrame:
    """Replays per source bucket [k, replayed]: each experiential group counted in the bucket of its
    question's previous group (what `ExperienceStore.replay_buckets` computes, here in SQL with LAG)."""
    G = GroupResultRow
    prev = func.lag(G.k).over(partition_by=G.question_id, order_by=(G.step, G.id)).label("prev_k")
    history = select(G.is_replay, prev).where(G.run_id == run_id).subquery()
    stmt = (select(history.c.prev_k, func.count()).where(history.c.is_replay.is_(True), history.c.prev_k.is_not(None))
            .group_by(history.c.prev_k).order_by(history.c.prev_k))
    with reading(url, "replays per bucket") as conn:
        return _frame(conn, stmt, ["k", "replayed"]).astype({"k": int, "replayed": int})


def replay_ratio(url: str, run_id: str) -> float | None:
    """The run's `buffer.replay_ratio` from its stored config (None when the config does not say)."""
    with reading(url, "the run's config") as conn:
        row = conn.execute(select(Run.config_json).where(Run.id == run_id)).one_or_none() if conn is not None else None
    try:
        value = json.loads((row[0] if row else None) or "{}").get("buffer", {}).get("replay_ratio")
    except ValueError:
        return None
    return None if value is None else float(value)


def continuous_rewards(url: str, run_id: str) -> bool:
    """Whether the run trained on continuous rewards (its stored reward.kind; auto: a reward.fn / url)."""
    with reading(url, "the run's config") as conn:
        row = conn.execute(select(Run.config_json).where(Run.id == run_id)).one_or_none() if conn is not None else None
    try:
        reward = json.loads((row[0] if row else None) or "{}").get("reward", {})
    except ValueError:
        return False
    kind = reward.get("kind", "auto")
    return kind == "continuous" or (kind == "auto" and bool(reward.get("fn") or reward.get("url")))


def succeeded(T, continuous: bool):
    """A stored rollout counted as a success: correct (reward > 0), or with continuous rewards above the
    mean reward of its group (the fresh rollouts of its question verified at the same step)."""
    if not continuous:
        return T.reward > 0
    other = aliased(Trajectory)
    mean = (select(func.avg(other.reward)).where(other.run_id == T.run_id, other.question_id == T.question_id,
                                                 other.collected_step == T.collected_step).scalar_subquery())
    return T.reward > mean


SUCCESS_LABELS = {False: ("correct", "incorrect"), True: ("above group mean", "at or below group mean")}
"""What the two sides of `succeeded` are called on the pages."""


def target_weights(url: str, run_id: str) -> tuple[dict[int, float], str]:
    """The run's question-selection weights w(k/K), k = 1..K-1 (`selection.bucket_weights` on the run's stored
    config), normalised to sum 1, and the weighting's name; ({}, reason) when they cannot be derived."""
    with reading(url, "the run's config") as conn:
        row = conn.execute(select(Run.config_json, Run.group_size).where(Run.id == run_id)).one_or_none() \
            if conn is not None else None
    if row is None:
        return {}, "unknown run"
    try:
        sel = SelectionConfig.model_validate(json.loads(row[0] or "{}").get("selection", {}))
        w = bucket_weights(int(row[1]), sel.question_weighting, sel.sigma, sel.sigma_unit, sel.mu,
                           top=continuous_rewards(url, run_id))
    except (ValueError, SelectionError) as e:
        return {}, f"the stored config gives no weights ({str(e).splitlines()[0]})"
    if sel.question_weighting in PER_QUESTION:
        return {}, f"{sel.question_weighting}: every pooled question equally likely, no per-bucket target"
    total = sum(w.values())
    return {k: v / total for k, v in w.items()}, sel.question_weighting


# ---- entropy ----------------------------------------------------------------------------------------
def step_bounds(url: str, run_id: str) -> tuple[int, int] | None:
    """(first, last) step number that sampled the run's stored trajectories, or None when it has none."""
    mine = Trajectory.run_id == run_id  # two subqueries: each is one index probe, a joint min/max scans the run
    stmt = select(select(func.min(Trajectory.step)).where(mine).scalar_subquery(),
                  select(func.max(Trajectory.step)).where(mine).scalar_subquery())
    with reading(url, "trajectory steps") as conn:
        row = conn.execute(stmt).one() if conn is not None else (None, None)
    return None if row[0] is None else (M.step_number(int(row[0])), M.step_number(int(row[1])))


# GROUP BY output positions: each use of an expression with bound parameters (bin width, labels) is a new
# parameter, which PostgreSQL does not recognise as the selected expression.
BY_FIRST_TWO = (text("1"), text("2"))


def _bin(col):
    return cast(col / BIN_WIDTH, Integer)  # entropy >= 0, so truncation is floor


def _agg(col) -> tuple:
    return func.count(), func.sum(col), func.sum(col * col), func.min(col), func.max(col)


def entropy_histogram(url: str, run_id: str, lo: int, hi: int, by: str, continuous: bool = False) -> pd.DataFrame:
    """Fixed-width (BIN_WIDTH) entropy histogram of trajectories generated at step numbers lo..hi.

    `by`: "correct" (`succeeded` vs not), "bucket" (k of the group the trajectory was verified in),
    "source" (fresh rollouts vs replays, the latter with entropy under the policy at replay time).
    Returns [group, bin, n, sum, sumsq, lo, hi] (lo/hi: the bin's smallest and largest entropy): the page
    merges bins and derives means, spreads and each group's exact range.
    """
    T, G, R = Trajectory, GroupResultRow, Replay
    lo, hi = index_of(lo), index_of(hi)
    in_range = and_(T.run_id == run_id, T.step >= lo, T.step <= hi, T.entropy.is_not(None))
    yes, no = SUCCESS_LABELS[continuous]
    if by == "correct":
        group = case((succeeded(T, continuous), yes), else_=no)
        stmts = [select(group, _bin(T.entropy), *_agg(T.entropy))
                 .where(in_range).group_by(*BY_FIRST_TWO)]
    elif by == "bucket":
        stmts = [select(G.k, _bin(T.entropy), *_agg(T.entropy))
                 .join(G, and_(G.run_id == T.run_id, G.question_id == T.question_id, G.step == T.collected_step))
                 .where(in_range).group_by(*BY_FIRST_TWO)]
    elif by == "source":
        fresh = case((succeeded(T, continuous), f"fresh {yes}"), else_=f"fresh {no}")
        stmts = [select(fresh, _bin(T.entropy), *_agg(T.entropy))
                 .where(in_range).group_by(*BY_FIRST_TWO),
                 select(literal("replayed"), _bin(R.entropy), *_agg(R.entropy))
                 .where(R.run_id == run_id, R.step >= lo, R.step <= hi, R.entropy.is_not(None))
                 .group_by(text("2"))]
    else:
        raise DashboardError(f"unknown entropy grouping {by!r}: use correct, bucket or source")
    cols = ["group", "bin", "n", "sum", "sumsq", "lo", "hi"]
    with reading(url, "entropy histograms") as conn:
        out = pd.concat([_frame(conn, s, cols) for s in stmts], ignore_index=True)
    return out.astype({"group": str, "bin": int, "n": int, "sum": float, "sumsq": float, "lo": float, "hi": float})


def replay_entropy_by_step(url: str, run_id: str) -> pd.DataFrame:
    """Mean entropy (under the policy at replay time) and count of replayed trajectories per step."""
    R = Replay
    stmt = (select(R.step, func.avg(R.entropy), func.count()).where(R.run_id == run_id)
            .group_by(R.step).order_by(R.step))
    with reading(url, "replays") as conn:
        return numbered(_frame(conn, stmt, ["step", "mean_entropy", "replayed"]), "step")


# ---- experience browser -----------------------------------------------------------------------------
ORDERS = {"replayed": [("times_replayed", True), ("uid", False)], "uid": [("uid", False)],
          "latest step": [("last_step", True), ("uid", False)], "bucket": [("latest_k", False), ("uid", False)]}


def _sorted_by(columns, order: str) -> list:
    return [columns[c].desc() if descending else columns[c] for c, descending in ORDERS[order]]


def search_questions(url: str, run_id: str, *, bucket: int | None = None, retired: bool | None = None,
                     min_replayed: int = 0, text: str = "", order: str = "replayed", rolled_out: bool = False,
                     offset: int = 0, limit: int = PAGE_SIZE) -> tuple[pd.DataFrame, int]:
    """One page of the run's questions matching the filters, and how many match in total.

    rolled_out: only questions with at least one verified group (n_groups > 0).

    The question text is joined only for a text search and for the page's own rows, so paging
    through a run's 50k question states never joins them all.
    """
    qs, q = QuestionState, QuestionRow
    where = [qs.run_id == run_id, qs.times_replayed >= min_replayed]
    if bucket is not None:
        where.append(qs.latest_k == bucket)
    if retired is not None:
        where.append(qs.retired.is_(retired))
    if rolled_out:
        where.append(qs.n_groups > 0)
    matching = select(qs.__table__).where(*where)
    if text.strip():
        pattern = f"%{text.strip()}%"
        matching = matching.join(q, q.id == qs.question_id).where(or_(q.text.ilike(pattern), qs.uid.ilike(pattern)))
    if order not in ORDERS:
        raise DashboardError(f"unknown order {order!r}: use one of {sorted(ORDERS)}")
    state_cols = ["question_id", "uid", "latest_k", "n_groups", "last_step", "retired", "times_replayed",
                  "pool_size"]
    rows = matching.order_by(*_sorted_by(qs.__table__.c, order)).limit(limit).offset(offset).subquery()
    page = (select(*(rows.c[c] for c in state_cols), q.text, q.answer).join(q, q.id == rows.c.question_id)
            .order_by(*_sorted_by(rows.c, order)))
    total = select(func.count()).select_from(matching.subquery())
    with reading(url, "questions") as conn:
        out = _frame(conn, page, state_cols + ["text", "answer"])
        n = int(conn.execute(total).scalar_one()) if conn is not None else 0
    out["retired"] = out["retired"].astype(bool)
    return numbered(out, "last_step"), n


def question_groups(url: str, run_id: str, question_id: int) -> pd.DataFrame:
    """The question's group history: [step, k, n, is_replay] in step order."""
    G = GroupResultRow
    stmt = (select(G.step, G.k, G.n, G.is_replay).where(G.run_id == run_id, G.question_id == question_id)
            .order_by(G.step, G.id))
    with reading(url, "group history") as conn:
        out = _frame(conn, stmt, ["step", "k", "n", "is_replay"])
    out["is_replay"] = out["is_replay"].astype(bool)
    return numbered(out, "step")


def question_trajectories(url: str, run_id: str, question_id: int, *, correct: bool | None = None,
                          replayed: bool | None = None, offset: int = 0,
                          limit: int = PAGE_SIZE, continuous: bool = False) -> tuple[pd.DataFrame, int]:
    """One page of the question's stored trajectories (newest first) and how many match in total.

    correct: `succeeded` (True) or not (False); replayed: replayed at least once (True) or never (False).
    """
    T = Trajectory
    cols = ["id", "step", "collected_step", "reward", "entropy", "length", "truncated", "in_pool", "retired",
            "times_replayed", "last_replayed_step", "text"]
    where = [T.run_id == run_id, T.question_id == question_id]
    if correct is not None:
        where.append(succeeded(T, continuous) if correct else ~succeeded(T, continuous))
    if replayed is not None:
        where.append(T.times_replayed > 0 if replayed else T.times_replayed == 0)
    page = (select(*(getattr(T, c) for c in cols), succeeded(T, continuous)).where(*where)  # newest group first
            .order_by(T.collected_step.desc(), T.id.desc()).limit(limit).offset(offset))
    with reading(url, "trajectories") as conn:
        rows = _frame(conn, page, cols + ["succeeded"])
        n = int(conn.execute(select(func.count()).select_from(T).where(*where)).scalar_one()) if conn is not None else 0
    for c in ("truncated", "in_pool", "retired", "succeeded"):
        rows[c] = rows[c].astype(bool)
    return numbered(rows, "step", "collected_step", "last_replayed_step"), n


# ---- results ----------------------------------------------------------------------------------------
def eval_results(url: str, run_ids: tuple[str, ...]) -> pd.DataFrame:
    """Evaluation rows [run_id, step, benchmark, metric, value, n] of the runs."""
    E = EvalResult
    stmt = (select(E.run_id, E.step, E.benchmark, E.metric, E.value, E.n).where(E.run_id.in_(run_ids))
            .order_by(E.run_id, E.benchmark, E.metric, E.step, E.id))
    with reading(url, "evaluation results") as conn:  # the start model's evaluation (index -1) is step 0
        return numbered(_frame(conn, stmt, ["run_id", "step", "benchmark", "metric", "value", "n"]), "step")
