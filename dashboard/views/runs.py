"""Runs: every run in the experience database with its status, progress, preset and key metrics; the
selected runs' curves and links to their MLflow runs and Prefect flow runs."""

import pandas as pd
import streamlit as st

from dashboard import charts, db, ui
from dashboard import monitor_banner
from exgrpo_core import metrics as M

COLUMNS = {"name": "run", "status": "status", "step": "steps", "preset": "preset", "replay_active": "replay",
           "replay_started_step": "replay since step", M.REWARD_MEAN: "reward", M.FRESH_PASS1: "fresh pass@1",
           M.BUFFER_QUESTIONS: "buffer questions", M.BUFFER_TRAJECTORIES: "buffer trajectories",
           M.RETIRED_QUESTIONS: "retired", "updated_at": "updated", "id": "run id"}


def render() -> None:
    st.title("Runs")
    url = db.database_url()
    ui.sidebar(url)
    runs = ui.runs_or_stop(url)
    banner = st.container()  # the selected runs' monitor firings, filled once the selection is known
    counts = runs["status"].value_counts()
    shown = ["running", "finished", "failed", "stopped", "killed"]  # every status a run ends in: they add up
    shown += sorted(set(counts.index) - set(shown))
    cols = st.columns(1 + len(shown))
    cols[0].metric("runs", len(runs))
    for col, status in zip(cols[1:], shown):
        col.metric(status, int(counts.get(status, 0)))
    st.caption("Key metrics are those of each run's last completed step; `replay` says whether experience "
               "replay is on (it starts once a step's fraction of correct rollouts passes the threshold).")
    table = runs[list(COLUMNS)].rename(columns=COLUMNS)
    since = table["replay since step"]  # a run that never replayed: "never", not a bare None
    table["replay since step"] = since.map(lambda v: "never" if pd.isna(v) else str(int(v)))
    st.dataframe(table, hide_index=True, width="stretch",
                 column_config={"reward": st.column_config.NumberColumn(format="%.3f"),
                                "fresh pass@1": st.column_config.NumberColumn(format="%.3f")})

    st.subheader("Select runs")
    chosen = ui.pick_runs(runs, where=st)
    with banner:
        monitor_banner.render(url, tuple(chosen))
    if not chosen:
        st.info("Select one or more runs to see their curves here and compare them on the Results page.")
        return
    if st.session_state.get("run_id") not in chosen:  # single-run pages open the first selected run
        st.session_state["run_id"] = chosen[0]
    ui.live(runs[runs.id.isin(chosen)], lambda: selected(url, runs, chosen))


def selected(url: str, runs: pd.DataFrame, chosen: list[str]) -> None:
    """The selected runs: curves, links to MLflow / Prefect, and links to the other pages."""
    series = ui.metric_series(url, tuple(chosen), (M.REWARD_MEAN, M.FRESH_PASS1))
    if series.empty:
        st.info("The selected runs have not completed a step yet.")
        return
    series["run"] = series["run_id"].map(ui.names(runs))
    left, right = st.columns(2)
    left.altair_chart(charts.lines(series[series.key == M.REWARD_MEAN], "value", "run", "reward mean",
                                   "reward"), width="stretch")
    right.altair_chart(charts.lines(series[series.key == M.FRESH_PASS1], "value", "run", "fresh pass@1",
                                    "pass@1"), width="stretch")
    st.markdown("**Links**")
    ui.show_links(url, runs.set_index("id").loc[chosen].reset_index())
    overlay = {"overlay": ",".join(chosen)}
    st.page_link("views/buffer.py", label="Buffer of the selected runs", icon=":material/inventory_2:",
                 query_params=overlay)
    st.page_link("views/entropy.py", label="Entropy of the selected runs", icon=":material/bar_chart:",
                 query_params=overlay)
    st.page_link("views/results.py", label="Compare the selected runs", icon=":material/leaderboard:")


with ui.explained():
    render()
