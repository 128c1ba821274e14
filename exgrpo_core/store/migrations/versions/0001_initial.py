"""Initial schema: runs, questions, question_states, group_results, trajectories, replays, step_metrics,
eval_results.

Written out table by table (not `metadata.create_all`) so this revision stays fixed when the models change;
`tests/exgrpo_core/store/test_store_schema.py` checks that head matches `exgrpo_core.store.tables`.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _run_fk() -> sa.ForeignKey:
    return sa.ForeignKey("runs.id")


def _question_fk() -> sa.ForeignKey:
    return sa.ForeignKey("questions.id")


def upgrade() -> None:
    _create_runs_and_questions()
    _create_states_and_groups()
    _create_trajectories()
    _create_replays()
    _create_metrics_and_evals()


def _create_runs_and_questions() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("preset", sa.String(200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("group_size", sa.Integer, nullable=False),
        sa.Column("config_json", sa.Text, nullable=False),
        sa.Column("mlflow_run_id", sa.String(64), nullable=True),
        sa.Column("replay_active", sa.Boolean, nullable=False),
        sa.Column("replay_started_step", sa.Integer, nullable=True),
    )
    op.create_index("ix_runs_name", "runs", ["name"])
    op.create_table(
        "questions",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("digest", sa.String(40), nullable=False, unique=True),
        sa.Column("uid", sa.String(200), nullable=False),
        sa.Column("source", sa.String(200), nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("messages_json", sa.Text, nullable=False),
        sa.Column("answer", sa.Text, nullable=False),
    )


def _create_states_and_groups() -> None:
    op.create_table(
        "question_states",
        sa.Column("run_id", sa.String(64), _run_fk(), primary_key=True),
        sa.Column("question_id", sa.Integer, _question_fk(), primary_key=True),
        sa.Column("uid", sa.String(200), nullable=False),
        sa.Column("latest_k", sa.Integer, nullable=True),
        sa.Column("n_groups", sa.Integer, nullable=False),
        sa.Column("last_step", sa.Integer, nullable=True),
        sa.Column("retired", sa.Boolean, nullable=False),
        sa.Column("retired_step", sa.Integer, nullable=True),
        sa.Column("times_replayed", sa.Integer, nullable=False),
        sa.Column("pool_size", sa.Integer, nullable=False),
        sa.UniqueConstraint("run_id", "uid", name="uq_question_states_run_uid"),
    )
    op.create_index("ix_question_states_run_retired_k", "question_states", ["run_id", "retired", "latest_k"])
    op.create_table(
        "group_results",
        sa.Column("id", BigId, primary_key=True),
        sa.Column("run_id", sa.String(64), _run_fk(), nullable=False),
        sa.Column("question_id", sa.Integer, _question_fk(), nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("k", sa.Integer, nullable=False),
        sa.Column("n", sa.Integer, nullable=False),
        sa.Column("is_replay", sa.Boolean, nullable=False),
    )
    op.create_index("ix_group_results_run_question_step", "group_results", ["run_id", "question_id", "step"])


def _create_metrics_and_evals() -> None:
    op.create_table(
        "step_metrics",
        sa.Column("run_id", sa.String(64), _run_fk(), primary_key=True),
        sa.Column("step", sa.Integer, primary_key=True),
        sa.Column("key", sa.String(200), primary_key=True),
        sa.Column("value", sa.Float, nullable=True),
    )
    op.create_table(
        "eval_results",
        sa.Column("id", BigId, primary_key=True),
        sa.Column("run_id", sa.String(64), _run_fk(), nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("benchmark", sa.String(200), nullable=False),
        sa.Column("metric", sa.String(200), nullable=False),
        sa.Column("value", sa.Float, nullable=True),
        sa.Column("n", sa.Integer, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_eval_results_run_step", "eval_results", ["run_id", "step"])


def _create_trajectories() -> None:
    op.create_table(
        "trajectories",
        sa.Column("id", BigId, primary_key=True),
        sa.Column("run_id", sa.String(64), _run_fk(), nullable=False),
        sa.Column("question_id", sa.Integer, _question_fk(), nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("collected_step", sa.Integer, nullable=False),
        sa.Column("reward", sa.Float, nullable=False),
        sa.Column("entropy", sa.Float, nullable=True),
        sa.Column("length", sa.Integer, nullable=False),
        sa.Column("truncated", sa.Boolean, nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("text_sha1", sa.String(40), nullable=False),
        sa.Column("token_ids", sa.LargeBinary, nullable=False),
        sa.Column("behaviour_logprobs", sa.LargeBinary, nullable=False),
        sa.Column("in_pool", sa.Boolean, nullable=False),
        sa.Column("retired", sa.Boolean, nullable=False),
        sa.Column("times_replayed", sa.Integer, nullable=False),
        sa.Column("last_replayed_step", sa.Integer, nullable=True),
    )
    op.create_index("ix_trajectories_run_question_pool", "trajectories", ["run_id", "question_id", "in_pool"])
    op.create_index("ix_trajectories_run_step", "trajectories", ["run_id", "step"])


def _create_replays() -> None:
    op.create_table(
        "replays",
        sa.Column("id", BigId, primary_key=True),
        sa.Column("run_id", sa.String(64), _run_fk(), nullable=False),
        sa.Column("trajectory_id", BigId, sa.ForeignKey("trajectories.id"), nullable=False),
        sa.Column("question_id", sa.Integer, _question_fk(), nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("entropy", sa.Float, nullable=True),
    )
    op.create_index("ix_replays_run_step", "replays", ["run_id", "step"])
    op.create_index("ix_replays_trajectory", "replays", ["trajectory_id"])


def downgrade() -> None:
    for table in ("eval_results", "step_metrics", "replays", "trajectories", "group_results",
                  "question_states", "questions", "runs"):
        op.drop_table(table)
