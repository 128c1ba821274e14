"""Covering indexes for the dashboard's entropy histograms (benchmarks/scale/dashboard_queries.py).

The Entropy page aggregates trajectories of a step range by reward, entropy and the k of the group
each was verified in. Without these the database visits every trajectory row in the range, and those
rows carry the token / log-prob payloads (kilobytes each); with them the histogram reads the index
only, and the group lookup gets k from its index. Data-preserving; the downgrade drops the indexes.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

INDEXES = [
    ("ix_trajectories_run_step_entropy", "trajectories",
     ["run_id", "step", "entropy", "reward", "question_id", "collected_step"]),
    ("ix_group_results_run_question_step_k", "group_results", ["run_id", "question_id", "step", "k"]),
]


def upgrade() -> None:
    for name, table, cols in INDEXES:
        op.create_index(name, table, cols)


def downgrade() -> None:
    for name, table, _ in INDEXES:
        op.drop_index(name, table_name=table)
