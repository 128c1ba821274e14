"""Replay sampling without reading the whole pool (ExperienceStore.sample_replay_questions).

A partial index of the pooled questions (not retired, pool_size > 0) by (run, latest k, uid): bucket
sizes are a GROUP BY over it and the chosen questions a rank inside one bucket, both index-only
(retired and pool_size are carried too: SQLite's planner needs them to treat the index as covering).
On PostgreSQL `question_states.uid` gets the "C" collation (byte order of UTF-8 = code-point order,
Python's sorted()), so the index order is the order `buffer_state` lists buckets in; SQLite's default
BINARY collation already is. Data-preserving (no row changes); the downgrade restores both.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

INDEX = "ix_question_states_run_pool_k_uid"
POOLED = {"postgresql_where": sa.text("retired IS false AND pool_size > 0"),
          "sqlite_where": sa.text("retired IS 0 AND pool_size > 0")}


def _set_uid_collation(collation: str | None) -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.alter_column("question_states", "uid", type_=sa.String(200, collation=collation),
                        existing_type=sa.String(200), existing_nullable=False)


def upgrade() -> None:
    _set_uid_collation("C")
    op.create_index(INDEX, "question_states", ["run_id", "latest_k", "uid", "retired", "pool_size"], **POOLED)


def downgrade() -> None:
    op.drop_index(INDEX, table_name="question_states")
    _set_uid_collation("default")
