"""SQLAlchemy 2 models of the experience database; only `store.py` and the migrations use them.

Every per-run table carries `run_id` and every query filters on it, so runs sharing one database
never see each other's experience. `questions` is the one shared table (keyed by a content digest).
Schema changes go through Alembic migrations in `exgrpo_core/store/migrations/versions/`.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (BigInteger, Boolean, DateTime, Float, ForeignKey, Index, Integer, LargeBinary, MetaData,
                        String, Text, UniqueConstraint, text)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# SQLite only auto-increments an INTEGER PRIMARY KEY; PostgreSQL gets 64-bit ids for the big tables.
BigId = BigInteger().with_variant(Integer(), "sqlite")


# Deterministic constraint names, so later migrations can refer to them on both backends.
NAMING = {"ix": "ix_%(column_0_label)s", "uq": "uq_%(table_name)s_%(column_0_name)s",
          "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s", "pk": "pk_%(table_name)s"}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Run(Base):
    __tablename__ = "runs"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), index=True)
    preset: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    status: Mapped[str] = mapped_column(String(16))  # running / finished / failed / stopped / killed
    step: Mapped[int] = mapped_column(Integer)  # last completed step, -1 before the first
    group_size: Mapped[int] = mapped_column(Integer)
    config_json: Mapped[str] = mapped_column(Text)
    mlflow_run_id: Mapped[str | None] = mapped_column(String(64))
    replay_active: Mapped[bool] = mapped_column(Boolean)
    replay_started_step: Mapped[int | None] = mapped_column(Integer)
    # pool slots are logged (pool_slot_log) for steps after this one; rollback before it renumbers (0005)
    slots_logged_after: Mapped[int] = mapped_column(Integer, server_default=text("-1"))
    warm_start_json: Mapped[str | None] = mapped_column(Text)  # a warm start's sources and counts (0006)


class QuestionRow(Base):
    __tablename__ = "questions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    digest: Mapped[str] = mapped_column(String(40), unique=True)  # sha1(source, messages, answer)
    uid: Mapped[str] = mapped_column(String(200))  # dataset uid of the first registration
    source: Mapped[str] = mapped_column(String(200))
    text: Mapped[str] = mapped_column(Text)
    messages_json: Mapped[str] = mapped_column(Text)
    answer: Mapped[str] = mapped_column(Text)


class QuestionState(Base):
    __tablename__ = "question_states"
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), primary_key=True)
    question_id: Mapped[int] = mapped_column(ForeignKey("questions.id"), primary_key=True)
    # code-point order on both backends ("C" on PostgreSQL, SQLite's BINARY), as Python's sorted() (0004)
    uid: Mapped[str] = mapped_column(String(200).with_variant(String(200, collation="C"), "postgresql"))
    latest_k: Mapped[int | None] = mapped_column(Integer)  # None: never verified
    n_groups: Mapped[int] = mapped_column(Integer)
    last_step: Mapped[int | None] = mapped_column(Integer)
    retired: Mapped[bool] = mapped_column(Boolean)
    retired_step: Mapped[int | None] = mapped_column(Integer)
    times_replayed: Mapped[int] = mapped_column(Integer)
    pool_size: Mapped[int] = mapped_column(Integer)  # its in_pool trajectories: buffer_state reads no trajectory
    slot: Mapped[int | None] = mapped_column(Integer)  # place in its pooled bucket, 0..n-1; None outside (0005)
    warm_k: Mapped[int | None] = mapped_column(Integer)  # bucket from a warm start, kept by rollback (0006)
    __table_args__ = (
        UniqueConstraint("run_id", "uid", name="uq_question_states_run_uid"),
        Index("ix_question_states_run_retired_k", "run_id", "retired", "latest_k"),
        Index("ix_question_states_run_retired_step", "run_id", "retired_step"),  # rollback: un-retire
        # pooled questions by bucket and slot: replay sampling reads sizes (max slot) and picks from it (0005)
        Index("ix_question_states_run_pool_k_slot", "run_id", "latest_k", "slot", "uid", "retired", "pool_size",
              postgresql_where=text("retired IS false AND pool_size > 0"),
              sqlite_where=text("retired IS 0 AND pool_size > 0")),
    )


class PoolSlotLog(Base):
    """Undo log of pool slots: a question's slot before the buffer update of `step` changed it (0005)."""

    __tablename__ = "pool_slot_log"
    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"))
    step: Mapped[int] = mapped_column(Integer)
    question_id: Mapped[int] = mapped_column(ForeignKey("questions.id"))
    old_slot: Mapped[int | None] = mapped_column(Integer)
    __table_args__ = (Index("ix_pool_slot_log_run_step", "run_id", "step"),)


class RetirementReview(Base):
    """A retired question put back by the retired-set review of `step` (buffer.review_retired_every), with the
    retired_step it had, so that a rollback before `step` retires it again as it was (0007)."""

    __tablename__ = "retirement_reviews"
    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"))
    step: Mapped[int] = mapped_column(Integer)
    question_id: Mapped[int] = mapped_column(ForeignKey("questions.id"))
    retired_step: Mapped[int | None] = mapped_column(Integer)
    __table_args__ = (Index("ix_retirement_reviews_run_step", "run_id", "step"),)


class GroupResultRow(Base):
    __tablename__ = "group_results"
    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"))
    question_id: Mapped[int] = mapped_column(ForeignKey("questions.id"))
    step: Mapped[int] = mapped_column(Integer)
    k: Mapped[int] = mapped_column(Integer)
    n: Mapped[int] = mapped_column(Integer)  # group size, the replayed trajectory included
    is_replay: Mapped[bool] = mapped_column(Boolean)
    __table_args__ = (
        Index("ix_group_results_run_question_step", "run_id", "question_id", "step"),
        Index("ix_group_results_run_step", "run_id", "step"),  # rollback deletes by step
        Index("ix_group_results_run_question_step_k", "run_id", "question_id", "step", "k"),  # dashboard (0003)
    )


class Trajectory(Base):
    __tablename__ = "trajectories"
    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"))
    question_id: Mapped[int] = mapped_column(ForeignKey("questions.id"))
    step: Mapped[int] = mapped_column(Integer)  # policy version that generated it
    collected_step: Mapped[int] = mapped_column(Integer)  # buffer update that stored it (rollback key)
    reward: Mapped[float] = mapped_column(Float)
    entropy: Mapped[float | None] = mapped_column(Float)  # None when NaN (SQLite stores NaN as NULL)
    length: Mapped[int] = mapped_column(Integer)
    truncated: Mapped[bool] = mapped_column(Boolean)
    text: Mapped[str] = mapped_column(Text)
    text_sha1: Mapped[str] = mapped_column(String(40))  # narrows the exact-text de-duplication
    token_ids: Mapped[bytes] = mapped_column(LargeBinary)  # int32 little-endian [T]
    behaviour_logprobs: Mapped[bytes] = mapped_column(LargeBinary)  # float32 little-endian [T]
    in_pool: Mapped[bool] = mapped_column(Boolean)
    retired: Mapped[bool] = mapped_column(Boolean)  # was pooled, left the pool when its question retired
    times_replayed: Mapped[int] = mapped_column(Integer)
    last_replayed_step: Mapped[int | None] = mapped_column(Integer)
    # how it was graded (0006; None: written before the audit columns existed)
    prediction: Mapped[str | None] = mapped_column(Text)  # extracted final answer
    gold: Mapped[str | None] = mapped_column(Text)  # the gold as the grader read it
    verifier: Mapped[str | None] = mapped_column(String(32))  # "math" / "choice"
    verifier_version: Mapped[str | None] = mapped_column(String(100))
    verify_timed_out: Mapped[bool | None] = mapped_column(Boolean)
    verify_reason: Mapped[str | None] = mapped_column(String(16))
    # a warm start's copy: the source run and trajectory (0006)
    origin_run_id: Mapped[str | None] = mapped_column(String(64))
    origin_trajectory_id: Mapped[int | None] = mapped_column(BigId)
    __table_args__ = (
        Index("ix_trajectories_run_question_pool", "run_id", "question_id", "in_pool"),
        Index("ix_trajectories_run_step", "run_id", "step"),
        Index("ix_trajectories_run_collected_step", "run_id", "collected_step"),  # rollback deletes by it
        # dashboard entropy histograms read only this index (0003)
        Index("ix_trajectories_run_step_entropy", "run_id", "step", "entropy", "reward", "question_id",
              "collected_step"),
    )


class Replay(Base):
    __tablename__ = "replays"
    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"))
    trajectory_id: Mapped[int] = mapped_column(ForeignKey("trajectories.id"))
    question_id: Mapped[int] = mapped_column(ForeignKey("questions.id"))
    step: Mapped[int] = mapped_column(Integer)
    entropy: Mapped[float | None] = mapped_column(Float)  # under the policy at replay time
    __table_args__ = (
        Index("ix_replays_run_step", "run_id", "step"),
        Index("ix_replays_trajectory", "trajectory_id"),  # FK checks when rollback deletes trajectories
        Index("ix_replays_run_question", "run_id", "question_id"),  # rollback recounts per question
    )


class StepMetric(Base):
    __tablename__ = "step_metrics"
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(200), primary_key=True)
    value: Mapped[float | None] = mapped_column(Float)  # None when NaN


class EvalResult(Base):
    __tablename__ = "eval_results"
    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"))
    step: Mapped[int] = mapped_column(Integer)
    benchmark: Mapped[str] = mapped_column(String(200))
    metric: Mapped[str] = mapped_column(String(200))
    value: Mapped[float | None] = mapped_column(Float)
    n: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    __table_args__ = (Index("ix_eval_results_run_step", "run_id", "step"),)


class RewardChange(Base):
    """A stored reward changed by `exgrpo reverify --apply` (0006); no FK: outlives a rolled-back row."""

    __tablename__ = "reward_changes"
    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    trajectory_id: Mapped[int] = mapped_column(BigId)
    old_reward: Mapped[float] = mapped_column(Float)
    new_reward: Mapped[float] = mapped_column(Float)
    verifier: Mapped[str] = mapped_column(String(32))
    verifier_version: Mapped[str] = mapped_column(String(100))
    changed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
