"""Retired-set review (the paper's Table 7: every N steps a fraction of the retired questions is put back).

retirement_reviews: one row per question a review un-retired (run, step of the review, question, the
retired_step it had), the undo log that lets a rollback to a step before the review retire it again
exactly. Retirement was permanent before this revision, so existing runs need no rows.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "retirement_reviews",
        sa.Column("id", BigId, primary_key=True),
        sa.Column("run_id", sa.String(64), sa.ForeignKey("runs.id"), nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("question_id", sa.Integer, sa.ForeignKey("questions.id"), nullable=False),
        sa.Column("retired_step", sa.Integer, nullable=True),
    )
    op.create_index("ix_retirement_reviews_run_step", "retirement_reviews", ["run_id", "step"])


def downgrade() -> None:
    op.drop_index("ix_retirement_reviews_run_step", table_name="retirement_reviews")
    op.drop_table("retirement_reviews")
