"""Indexes for the experience database at scale (benchmarks/scale/db_scale.py, 1M trajectories).

Rollback to a step (resume) filters trajectories by collected_step and group results by step, and
rebuilds replay counters per question; without these each was a scan of the whole run. Adding
indexes keeps every row: the upgrade is data-preserving, the downgrade drops only the indexes.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

INDEXES = [
    ("ix_trajectories_run_collected_step", "trajectories", ["run_id", "collected_step"]),
    ("ix_group_results_run_step", "group_results", ["run_id", "step"]),
    ("ix_replays_run_question", "replays", ["run_id", "question_id"]),
    ("ix_question_states_run_retired_step", "question_states", ["run_id", "retired_step"]),
]


def upgrade() -> None:
    for name, table, cols in INDEXES:
        op.create_index(name, table, cols)


def downgrade() -> None:
    for name, table, _ in INDEXES:
        op.drop_index(name, table_name=table)
