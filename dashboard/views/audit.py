"""Verifier audit: how the run's stored trajectories were graded (verifier and version, timeouts,
missing predictions), the reward changes `exgrpo reverify --apply` made, and the graded rows
(prediction against gold) page by page. Read-only; `exgrpo reverify --run R` finds disagreements."""

import pandas as pd
import streamlit as st
from sqlalchemy import case, func, inspect, select

from dashboard import db, ui
from dashboard.queries import numbered, reading
from exgrpo_core.store.tables import QuestionState, RewardChange, Trajectory

ROWS_PER_PAGE = 50


def graded_by(url: str, run_id: str) -> pd.DataFrame:
    """Stored trajectories per (verifier, version): count, correct, timed out, without a prediction."""
    T = Trajectory
    cols = ["verifier", "version", "trajectories", "correct", "timed out", "no prediction"]
    with reading(url, "the verifier audit") as conn:
        if conn is None:
            return pd.DataFrame(columns=cols)
        rows = conn.execute(select(T.verifier, T.verifier_version, func.count(),
                                   func.sum(case((T.reward > 0, 1), else_=0)),
                                   func.sum(case((T.verify_timed_out.is_(True), 1), else_=0)),
                                   func.sum(case((T.prediction.is_(None), 1), else_=0)))
                            .where(T.run_id == run_id).group_by(T.verifier, T.verifier_version)).all()
    frame = pd.DataFrame(rows, columns=cols)
    frame[["verifier", "version"]] = frame[["verifier", "version"]].fillna("not recorded")
    return frame


def reward_changes(url: str, run_id: str) -> pd.DataFrame:
    R = RewardChange
    cols = ["trajectory", "old", "new", "verifier", "version", "changed at"]
    with reading(url, "reward changes") as conn:
        if conn is None:
            return pd.DataFrame(columns=cols)
        return pd.DataFrame(conn.execute(select(R.trajectory_id, R.old_reward, R.new_reward, R.verifier,
                                                R.verifier_version, R.changed_at)
                                         .where(R.run_id == run_id).order_by(R.id.desc()).limit(500)).all(), columns=cols)


def graded_rows(url: str, run_id: str, offset: int, only_timeouts: bool) -> pd.DataFrame:
    T, QS = Trajectory, QuestionState
    cols = ["trajectory", "question", "step", "reward", "prediction", "gold", "reason", "verifier", "in pool"]
    q = (select(T.id, QS.uid, T.step, T.reward, T.prediction, T.gold, T.verify_reason, T.verifier_version, T.in_pool)
         .join(QS, (QS.run_id == T.run_id) & (QS.question_id == T.question_id)).where(T.run_id == run_id))
    if only_timeouts:
        q = q.where(T.verify_timed_out.is_(True))
    with reading(url, "graded trajectories") as conn:
        if conn is None:
            return pd.DataFrame(columns=cols)
        return numbered(pd.DataFrame(conn.execute(q.order_by(T.id.desc()).limit(ROWS_PER_PAGE).offset(offset)).all(),
                                     columns=cols), "step")  # the step that sampled it, as users count


def render() -> None:
    st.title("Verifier audit")
    url = db.database_url()
    ui.sidebar(url)
    runs = ui.runs_or_stop(url)
    run = ui.pick_run(runs)
    if not inspect(db.readonly_engine(url)).has_table("reward_changes"):
        st.info("This database predates the verifier audit (revision 0006): run `exgrpo db upgrade`.")
        st.stop()
    st.caption("What the verifier read for each stored trajectory. `exgrpo reverify --run NAME` grades them "
               "again with the current verifier and lists disagreements; `--apply` changes them, recorded below.")
    by = graded_by(url, run.id)
    c = st.columns(4)
    c[0].metric("stored trajectories", int(by["trajectories"].sum()))
    c[1].metric("verifier timeouts", int(by["timed out"].sum()))
    c[2].metric("verifier versions", len(by))
    changes = reward_changes(url, run.id)
    c[3].metric("reward changes", len(changes))
    st.subheader("Graded by")
    st.dataframe(by, hide_index=True, width="stretch")
    st.subheader("Reward changes")
    if changes.empty:
        st.info("No stored reward of this run was changed (`exgrpo reverify --apply` records each change here).")
    else:
        st.dataframe(changes, hide_index=True, width="stretch")
    st.subheader("Graded trajectories, newest first")
    left, right = st.columns([1, 3])
    only = left.checkbox("timeouts only")
    page = right.number_input("page", min_value=1, value=1, step=1)
    st.dataframe(graded_rows(url, run.id, (int(page) - 1) * ROWS_PER_PAGE, only), hide_index=True, width="stretch")


with ui.explained():
    render()
