"""Pool slots: O(log n) replay sampling and an undo log for exact resume.

Each pooled question (not retired, pool_size > 0) gets a dense `slot` 0..n-1 inside its bucket
(latest k), kept dense on write by swap-remove; the bucket size is max(slot) + 1 and a drawn
position is one index lookup, both on a partial index (run, k, slot) that replaces 0004's (run, k,
uid). `pool_slot_log` holds a question's slot before each buffer update that changed it, so a
rollback restores slots exactly; `runs.slots_logged_after` is the step after which that log is
complete (rolling back before it renumbers by uid, the order of the code before this revision).

Backfill: the pooled questions of every existing run get slots in code-point uid order (the order
`buffer_state` listed them in before), and `slots_logged_after` = the run's step. The downgrade
drops the table, the column and the index and restores 0004's index; rows are kept.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

OLD_INDEX, INDEX = "ix_question_states_run_pool_k_uid", "ix_question_states_run_pool_k_slot"
POOLED = {"postgresql_where": sa.text("retired IS false AND pool_size > 0"),
          "sqlite_where": sa.text("retired IS 0 AND pool_size > 0")}
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _backfill_slots(conn) -> None:
    """Slots 0..n-1 per (run, bucket) in code-point uid order (Python's sorted, as buffer_state did)."""
    pooled = POOLED[f"{conn.dialect.name}_where"]
    rows = conn.execute(sa.text(f"SELECT run_id, latest_k, question_id, uid FROM question_states WHERE {pooled}")).all()
    buckets: dict[tuple, list] = {}
    for run_id, k, qid, uid in rows:
        buckets.setdefault((run_id, k), []).append((uid, qid))
    params = [{"r": run_id, "q": qid, "s": slot} for (run_id, _), members in buckets.items()
              for slot, (_, qid) in enumerate(sorted(members))]
    stmt = sa.text("UPDATE question_states SET slot = :s WHERE run_id = :r AND question_id = :q")
    for i in range(0, len(params), 1000):
        conn.execute(stmt, params[i:i + 1000])


def upgrade() -> None:
    conn = op.get_bind()
    op.add_column("question_states", sa.Column("slot", sa.Integer, nullable=True))
    op.add_column("runs", sa.Column("slots_logged_after", sa.Integer, nullable=False, server_default=sa.text("-1")))
    op.create_table(
        "pool_slot_log",
        sa.Column("id", BigId, primary_key=True),
        sa.Column("run_id", sa.String(64), sa.ForeignKey("runs.id"), nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("question_id", sa.Integer, sa.ForeignKey("questions.id"), nullable=False),
        sa.Column("old_slot", sa.Integer, nullable=True),
    )
    op.create_index("ix_pool_slot_log_run_step", "pool_slot_log", ["run_id", "step"])
    _backfill_slots(conn)
    conn.execute(sa.text("UPDATE runs SET slots_logged_after = step"))
    op.drop_index(OLD_INDEX, table_name="question_states")
    op.create_index(INDEX, "question_states", ["run_id", "latest_k", "slot", "uid", "retired", "pool_size"], **POOLED)


def downgrade() -> None:
    op.drop_index(INDEX, table_name="question_states")
    op.create_index(OLD_INDEX, "question_states", ["run_id", "latest_k", "uid", "retired", "pool_size"], **POOLED)
    op.drop_index("ix_pool_slot_log_run_step", table_name="pool_slot_log")
    op.drop_table("pool_slot_log")
    op.drop_column("runs", "slots_logged_after")
    op.drop_column("question_states", "slot")
