"""Experience browser: search the run's questions (bucket, retired, times replayed, text; only rolled-out
ones unless asked) page by page; click a row to open its question: its history of groups and its stored
trajectories grouped by the step (group) they were verified in, filterable by correct / replayed, with the
graded answer highlighted. Filters and the open question are kept in the URL."""

import html
import math

import pandas as pd
import streamlit as st

from dashboard import charts, db, ui
from dashboard.highlight import highlight_answer, plain_html

QUESTIONS_PER_PAGE = 25
TRAJECTORIES_PER_PAGE = 20
ANY = "any"
RETIRED = {ANY: None, "yes": True, "no": False}
CORRECT = {ANY: None, "correct": True, "incorrect": False}
CONTINUOUS = {ANY: None, "above group mean": True, "at or below group mean": False}  # continuous rewards
REPLAYED = {ANY: None, "replayed": True, "never replayed": False}
ORDERS = ["replayed", "latest step", "bucket", "uid"]
TABLE_KEY = "question_table"


def _choice(label: str, name: str, options: list, where=st, **kw):
    value = where.selectbox(label, options, key=ui.option(name, options[0], choices=options, parse=_parse(options)),
                            **kw)
    ui.remember(name, value)
    return value


def _parse(options: list):
    return lambda raw: next((o for o in options if str(o) == raw), options[0])


def _filters(K: int) -> dict:
    c = st.columns([1, 1, 1, 2, 1])
    bucket = _choice("bucket k", "bucket", [ANY, *range(K + 1)], c[0])
    retired = _choice("retired", "retired", list(RETIRED), c[1])
    min_replayed = c[2].number_input("replayed at least", min_value=0, step=1,
                                     key=ui.option("min_replayed", 0, parse=lambda s: max(0, int(s))))
    ui.remember("min_replayed", int(min_replayed))
    text = c[3].text_input("text or uid contains", key=ui.option("text", ""))
    ui.remember("text", text)
    order = _choice("order by", "order", ORDERS, c[4])
    everything = st.toggle("include questions not rolled out yet", key=ui.option("all", False, parse=ui.flag),
                           help="by default only questions with at least one verified group are listed")
    ui.remember("all", everything)
    return dict(bucket=None if bucket == ANY else int(bucket), retired=RETIRED[retired],
                min_replayed=int(min_replayed), text=text, order=order, rolled_out=not everything)


def _pager(total: int, per_page: int, key: str) -> int:
    pages = max(1, math.ceil(total / per_page))
    page = st.number_input(f"page (of {pages})", min_value=1, max_value=pages, value=1, step=1, key=key)
    return (int(page) - 1) * per_page


def _opened(rows: pd.DataFrame, event) -> int:
    """Row index of the question to open: the clicked row, else the one in the URL (`?q=uid`), else the first."""
    picked = list(getattr(getattr(event, "selection", None), "rows", []) or [])
    if picked and picked[0] < len(rows):
        return int(picked[0])
    uid = st.query_params.get("q")
    matches = rows.index[rows["uid"] == uid].tolist() if uid else []
    return int(matches[0]) if matches else 0


def _group_header(step: int, groups: pd.DataFrame, K: int, shown: int) -> str:
    at = groups[groups.step == step]
    kinds = [f"k = {int(g.k)}/{K} ({'mixed: with a replayed trajectory' if g.is_replay else 'fresh'})"
             for g in at.itertuples()]
    return f"step {step} · group {', '.join(kinds) or 'not recorded'} · {shown} shown"


def _trajectories(url: str, run_id: str, qid: int, groups: pd.DataFrame, K: int) -> None:
    c = st.columns([1, 1, 3])
    continuous = ui.continuous_rewards(url, run_id)
    labels = CONTINUOUS if continuous else CORRECT
    correct = _choice("trajectories", "correct", list(labels), c[0])
    replayed = _choice("replayed", "replayed", list(REPLAYED), c[1])
    f = dict(correct=labels[correct], replayed=REPLAYED[replayed], continuous=continuous)
    _, total = ui.question_trajectories(url, run_id, qid, **f, offset=0, limit=1)
    if total == 0:
        st.info("No stored trajectory of this question matches these filters."
                if any(f[k] is not None for k in ("correct", "replayed"))
                else "No stored trajectories for this question (experience is stored once replay is on; other "
                     "rollouts only with `buffer.store_all_rollouts`).")
        return
    st.markdown(f"**{total} stored trajectories** (newest group first, grouped by the step they were verified in)")
    offset = _pager(total, TRAJECTORIES_PER_PAGE, key="traj_page")
    trajs, _ = ui.question_trajectories(url, run_id, qid, **f, offset=offset, limit=TRAJECTORIES_PER_PAGE)
    for step, part in trajs.groupby("collected_step", sort=False):
        with st.expander(_group_header(int(step), groups, K, len(part)), expanded=True):
            for t in part.itertuples():
                state = "in pool" if t.in_pool else "retired" if t.retired else "not pooled"
                entropy = "—" if pd.isna(t.entropy) else f"{t.entropy:.4f}"
                st.caption(f"trajectory {t.id} · sampled in step {t.step} · reward {t.reward:g} · entropy {entropy} · "
                           f"{t.length} tokens{' (truncated)' if t.truncated else ''} · {state} · "
                           f"replayed {t.times_replayed}×")
                st.html(highlight_answer(t.text, t.succeeded))


def _question(url: str, run_id: str, q: pd.Series, K: int) -> None:
    # stored text is never Markdown (Streamlit's links even escaped URLs): the uid, prompt and answer as text
    st.html(f'<h3 style="margin:0">Question {html.escape(str(q.uid))}</h3>' + plain_html("Prompt:", q.text)
            + plain_html("Ground truth:", q.answer, monospace=True))
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
    _trajectories(url, run_id, int(q.question_id), groups, K)


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
            "No question of this run has been rolled out yet." if f["rolled_out"] else
            "This run has no registered questions yet.")
        return
    offset = _pager(total, QUESTIONS_PER_PAGE, key="question_page")
    rows, _ = ui.search_questions(url, run.id, **f, offset=offset, limit=QUESTIONS_PER_PAGE)
    st.caption(f"{total} questions match; showing {offset + 1}-{offset + len(rows)}. Click a row to open "
               "its question.")
    event = st.dataframe(rows.drop(columns=["question_id"]), hide_index=True, width="stretch", key=TABLE_KEY,
                         on_select="rerun", selection_mode="single-row")
    q = rows.iloc[_opened(rows, event)]
    st.query_params["q"] = q.uid
    _question(url, run.id, q, K)


with ui.explained():
    render()
