"""Verifier audit and experience reuse across runs (issue 17, parts 3 and 4).

trajectories: how each stored response was graded (`prediction`: the extracted final answer,
`gold`: the gold as the grader read it, `verifier` / `verifier_version`, `verify_timed_out`,
`verify_reason`) and, for a trajectory copied from an earlier run by a warm start, where it came
from (`origin_run_id`, `origin_trajectory_id`). All nullable: rows written before this revision
stay valid and read as "not recorded".
question_states.warm_k: the bucket a warm start gave the question (its latest k when no group of
this run remains, so a rollback keeps the seeded pool). runs.warm_start_json: the warm start's
sources and counts (set once; a resumed run is never seeded twice).
reward_changes: every stored reward `exgrpo reverify --apply` changed (trajectory id, old, new,
verifier and version, time); no foreign key, so the record outlives a rolled-back trajectory.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TRAJECTORY_COLUMNS = [
    sa.Column("prediction", sa.Text, nullable=True),
    sa.Column("gold", sa.Text, nullable=True),
    sa.Column("verifier", sa.String(32), nullable=True),
    sa.Column("verifier_version", sa.String(100), nullable=True),
    sa.Column("verify_timed_out", sa.Boolean, nullable=True),
    sa.Column("verify_reason", sa.String(16), nullable=True),
    sa.Column("origin_run_id", sa.String(64), nullable=True),
    sa.Column("origin_trajectory_id", BigId, nullable=True),
]


def upgrade() -> None:
    with op.batch_alter_table("trajectories") as t:
        for col in TRAJECTORY_COLUMNS:
            t.add_column(col.copy())
    op.add_column("question_states", sa.Column("warm_k", sa.Integer, nullable=True))
    op.add_column("runs", sa.Column("warm_start_json", sa.Text, nullable=True))
    op.create_table(
        "reward_changes",
        sa.Column("id", BigId, primary_key=True),
        sa.Column("run_id", sa.String(64), sa.ForeignKey("runs.id"), nullable=False),
        sa.Column("trajectory_id", BigId, nullable=False),
        sa.Column("old_reward", sa.Float, nullable=False),
        sa.Column("new_reward", sa.Float, nullable=False),
        sa.Column("verifier", sa.String(32), nullable=False),
        sa.Column("verifier_version", sa.String(100), nullable=False),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_reward_changes_run_id", "reward_changes", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_reward_changes_run_id", table_name="reward_changes")
    op.drop_table("reward_changes")
    op.drop_column("runs", "warm_start_json")
    op.drop_column("question_states", "warm_k")
    with op.batch_alter_table("trajectories") as t:
        for col in reversed(TRAJECTORY_COLUMNS):
            t.drop_column(col.name)
