"""Rolling a run's experience back to a checkpoint step (resume after a crash), in one transaction.

Rows written after the step are deleted; the per-question state and the replay counters are then
recomputed from what remains (group history, replays), and the pool slots restored from their undo
log (store_replay.restore_slots), so the result equals a run stopped at that step. Retirement is
stamped with its step, so it is undone iff `retired_step > step`; a retired-set review after `step`
(buffer.review_retired_every) is undone from its log: the question takes back the retired_step it had
before its first review after `step` and, if that is <= `step`, is retired again with its experiences.
"""

from __future__ import annotations

from sqlalchemy import Connection, and_, bindparam, case, delete, func, select, update

from exgrpo_core.store.buffer import chunks
from exgrpo_core.store.tables import (EvalResult, GroupResultRow, QuestionState, Replay, RetirementReview, Run,
                                      StepMetric, Trajectory)
from exgrpo_core.store.replay import restore_slots


def rollback_rows(conn: Connection, run_id: str, step: int) -> dict[str, int]:
    """Delete rows after `step` and rebuild what depended on them; returns rows deleted per table."""
    G, QS, R, T = GroupResultRow, QuestionState, Replay, Trajectory
    touched_q = set(conn.execute(select(G.question_id).where(G.run_id == run_id, G.step > step).distinct()).scalars())
    replayed = conn.execute(select(R.trajectory_id, R.question_id).where(R.run_id == run_id, R.step > step)).all()
    touched_q |= {qid for _, qid in replayed}
    unretire = set(conn.execute(select(QS.question_id).where(QS.run_id == run_id, QS.retired_step > step)).scalars())
    before_review = _retired_before_reviews(conn, run_id, step)  # question -> retired_step before its review
    deleted = {
        # replays first: they reference trajectories (a replay always follows its trajectory's collection)
        "replays": conn.execute(delete(R).where(R.run_id == run_id, R.step > step)).rowcount,
        "trajectories": conn.execute(delete(T).where(T.run_id == run_id, T.collected_step > step)).rowcount,
        "group_results": conn.execute(delete(G).where(G.run_id == run_id, G.step > step)).rowcount,
        "step_metrics": conn.execute(delete(StepMetric).where(
            StepMetric.run_id == run_id, StepMetric.step > step)).rowcount,
        "eval_results": conn.execute(delete(EvalResult).where(
            EvalResult.run_id == run_id, EvalResult.step > step)).rowcount,
    }
    conn.execute(delete(RetirementReview).where(RetirementReview.run_id == run_id, RetirementReview.step > step))
    for part in chunks(sorted(unretire)):
        conn.execute(update(T).where(T.run_id == run_id, T.question_id.in_(part), T.retired.is_(True))
                     .values(in_pool=True, retired=False))
    _re_retire(conn, run_id, {q: rs for q, rs in before_review.items() if rs is not None and rs <= step})
    _rebuild_states(conn, run_id, step, sorted(touched_q | unretire | before_review.keys()))
    logged_after = conn.execute(select(Run.slots_logged_after).where(Run.id == run_id)).scalar_one()
    restore_slots(conn, run_id, step, logged_after)
    _rebuild_replay_counters(conn, run_id, sorted({tid for tid, _ in replayed}))
    return deleted


def _retired_before_reviews(conn: Connection, run_id: str, step: int) -> dict[int, int | None]:
    """Each question a retired-set review after `step` put back: the retired_step it had before the first one."""
    RR = RetirementReview
    first: dict[int, int | None] = {}
    for qid, rs in conn.execute(select(RR.question_id, RR.retired_step).where(RR.run_id == run_id, RR.step > step)
                                .order_by(RR.step, RR.id)):
        first.setdefault(qid, rs)
    return first


def _re_retire(conn: Connection, run_id: str, retired_step: dict[int, int]) -> None:
    """Questions retired at `step` that a later review put back: retired again, experiences out of the pool."""
    QS, T = QuestionState, Trajectory
    for part in chunks(sorted(retired_step)):
        conn.execute(update(T).where(T.run_id == run_id, T.question_id.in_(part), T.in_pool.is_(True))
                     .values(in_pool=False, retired=True))
    if retired_step:
        conn.execute(update(QS).where(QS.run_id == bindparam("b_run"), QS.question_id == bindparam("b_qid")).values(
            retired=True, retired_step=bindparam("b_rs")),
            [dict(b_run=run_id, b_qid=q, b_rs=rs) for q, rs in sorted(retired_step.items())])


def _rebuild_states(conn: Connection, run_id: str, step: int, qids: list[int]) -> None:
    """latest_k, n_groups, last_step from group history; retirement kept iff stamped <= step; counters."""
    G, QS, R, T = GroupResultRow, QuestionState, Replay, Trajectory
    same_q = and_(G.run_id == QS.run_id, G.question_id == QS.question_id)
    kept = and_(QS.retired_step.is_not(None), QS.retired_step <= step)
    values = dict(
        latest_k=func.coalesce(select(G.k).where(same_q).order_by(G.step.desc(), G.id.desc()).limit(1)
                               .scalar_subquery(), QS.warm_k),  # a warm-started question keeps its bucket
        n_groups=select(func.count()).select_from(G).where(same_q).scalar_subquery(),
        last_step=select(func.max(G.step)).where(same_q).scalar_subquery(),
        retired=case((kept, True), else_=False),
        retired_step=case((kept, QS.retired_step), else_=None),
        times_replayed=select(func.count()).select_from(R).where(
            R.run_id == QS.run_id, R.question_id == QS.question_id).scalar_subquery(),
        pool_size=select(func.count()).select_from(T).where(
            T.run_id == QS.run_id, T.question_id == QS.question_id, T.in_pool.is_(True)).scalar_subquery(),
    )
    for part in chunks(qids):
        conn.execute(update(QS).where(QS.run_id == run_id, QS.question_id.in_(part)).values(**values))


def _rebuild_replay_counters(conn: Connection, run_id: str, trajectory_ids: list[int]) -> None:
    R, T = Replay, Trajectory
    values = dict(
        times_replayed=select(func.count()).select_from(R).where(R.trajectory_id == T.id).scalar_subquery(),
        last_replayed_step=select(func.max(R.step)).where(R.trajectory_id == T.id).scalar_subquery(),
    )
    for part in chunks(trajectory_ids):  # ids of trajectories deleted above simply match no row
        conn.execute(update(T).where(T.run_id == run_id, T.id.in_(part)).values(**values))
