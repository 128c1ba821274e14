"""Experience browser: search the run's questions (bucket, retired, times replayed, text) page by page;
for one question, its history of groups and every stored trajectory with the graded answer highlighted."""

import math

import pandas as pd
import streamlit as st

from dashboard import charts, db, ui
from dashboard.highlight import highlight_answer

QUESTIONS_PER_PAGE = 25
TRAJECTORIES_PER_PAGE = 10


def _filters(K: int) -> dict:
    c = st.columns([1, 1, 1, 2, 1])
    bucket = c[0].selectbox("bucket k", ["any", *range(K + 1)])
    retired = c[1].selectbox("retired", ["any", "yes", "no"])
    min_replayed = c[2].number_input("replayed at least", min_value=0, value=0, step=1)
    text = c[3].text_input("text or uid contains")
    order = c[4].selectbox("order by", ["replayed", "latest step", "bucket", "uid"])
    return dict(bucket=None if bucket == "any" else int(bucket),
                retired={"any": None, "yes": True, "no": False}[retired],
                min_replayed=int(min_replayed), text=text, order=order)


def _pager(total: int, per_page: int, key: str) -> int:
    pages = max(1, math.ceil(total / per_page))
    page = st.number_input(f"page (of {pages})", min_value=1, max_value=pages, value=1, step=1, key=key)
    return (int(page) - 1) * per_page


def _question(url: str, run_id: str, q: pd.Series, K: int) -> None:
    st.subheader(f"Question {q.uid}")
    st.markdown(f"**Prompt:** {q.text}  \n**Ground truth:** `{q.answer}`")
    c = st.columns(5)
    c[0].metric("latest k", "—" if pd.isna(q.latest_k) else f"{int(q.latest_k)} / {K}")
    c[1].metric("groups", int(q.n_groups))
    c[2].metric("times replayed", int(q.times_replayed))
    c[3].metric("in pool", int(q.pool_size))
    c[4].metric("retired", "yes" if q.retired else "no")
    groups = ui.question_groups(url, run_id, int(q.question_id))
    if groups.empty:
        st.info("This question has not been rolled out yet.")
    else:
        st.altair_chart(charts.group_history(groups, K), width="stretch")
    trajs, total = ui.question_trajectories(url, run_id, int(q.question_id), offset=0, limit=1)
    if total == 0:
        st.info("No stored trajectories for this question (experience is stored once replay is on; other "
                "rollouts only with `buffer.store_all_rollouts`).")
        return
    st.markdown(f"**{total} stored trajectories** (newest first)")
    offset = _pager(total, TRAJECTORIES_PER_PAGE, key="traj_page")
    trajs, _ = ui.question_trajectories(url, run_id, int(q.question_id), offset=offset, limit=TRAJECTORIES_PER_PAGE)
    st.dataframe(trajs.drop(columns=["text"]).rename(columns={"step": "policy version"}), hide_index=True,
                 width="stretch", column_config={"entropy": st.column_config.NumberColumn(format="%.4f")})
    for t in trajs.itertuples():
        with st.container(border=True):
            state = "in pool" if t.in_pool else "retired" if t.retired else "not pooled"
            entropy = "—" if pd.isna(t.entropy) else f"{t.entropy:.4f}"
            st.caption(f"trajectory {t.id} · policy version {t.step} · reward {t.reward:g} · entropy {entropy} · "
                       f"{t.length} tokens{' (truncated)' if t.truncated else ''} · {state} · "
                       f"replayed {t.times_replayed}×")
            st.html(highlight_answer(t.text, t.reward > 0))


def render() -> None:
    st.title("Experience browser")
    url = db.database_url()
    ui.sidebar(url)
    run = ui.pick_run(ui.runs_or_stop(url))
    K = int(run.group_size)
    f = _filters(K)
    _, total = ui.search_questions(url, run.id, **f, offset=0, limit=1)
    if total == 0:
        st.info("No question of this run matches these filters." if any(
            (f["bucket"] is not None, f["retired"] is not None, f["min_replayed"], f["text"])) else
            "This run has no registered questions yet.")
        return
    offset = _pager(total, QUESTIONS_PER_PAGE, key="question_page")
    rows, _ = ui.search_questions(url, run.id, **f, offset=offset, limit=QUESTIONS_PER_PAGE)
    st.caption(f"{total} questions match; showing {offset + 1}-{offset + len(rows)}.")
    st.dataframe(rows.drop(columns=["question_id"]), hide_index=True, width="stretch")
    labels = {f"{r.uid} — {str(r.text)[:60]}": i for i, r in enumerate(rows.itertuples())}
    chosen = st.selectbox("Question", list(labels))
    _question(url, run.id, rows.iloc[labels[chosen]], K)


with ui.explained():
    render()
