"""Staleness: how old the replayed trajectories are, and how far the current policy has moved from the
policies that sampled them (importance weights w and the shaped f(w) the loss applies). docs/monitors.md."""

import altair as alt
import pandas as pd
import streamlit as st

from dashboard import charts, db, monitor_queries, ui
from exgrpo_core import metrics as M

W = {M.REPLAY_W_P10: "w p10", M.REPLAY_W_P50: "w median", M.REPLAY_W_P90: "w p90", M.REPLAY_W_MAX: "w max"}
FW = {M.REPLAY_FW_P10: "f(w) p10", M.REPLAY_FW_P50: "f(w) median", M.REPLAY_FW_P90: "f(w) p90"}
AGE = {M.REPLAY_AGE_MEAN: "mean age", M.REPLAY_AGE_MAX: "max age"}
WINDOW = 50  # steps of the age heat map by default: one trajectory lookup per replay
replay_ages = st.cache_data(ttl=ui.TTL_S, show_spinner="loading...")(monitor_queries.replay_ages)


def age_heatmap(ages: pd.DataFrame) -> alt.Chart:
    """Replayed trajectories per (step, age): each column is one step's age distribution."""
    return alt.Chart(ages, title="replayed trajectories by age (steps since they were sampled)").mark_rect().encode(
        x=alt.X("step:O", title="step"), y=alt.Y("age:O", title="age (steps)", sort="descending"),
        color=alt.Color("replayed:Q", title="replayed", scale=alt.Scale(scheme="blues")),
        tooltip=["step:Q", "age:Q", "replayed:Q"]).properties(height=charts.HEIGHT)


def render() -> None:
    st.title("Staleness")
    url = db.database_url()
    ui.sidebar(url)
    runs = ui.runs_or_stop(url)
    run = ui.pick_run(runs)
    everything = st.sidebar.checkbox("All steps", value=False, help=f"default: the last {WINDOW} steps")
    ui.live(runs[runs["id"] == run.id], lambda: body(url, run.id, everything))  # redrawn while it trains


def body(url: str, run_id: str, everything: bool) -> None:
    """The page below the pickers; reads the run again, so a live redraw sees its new steps."""
    runs = ui.list_runs(url)
    run = runs[runs["id"] == run_id].iloc[0]
    first = 1 if everything else max(1, int(run.step) - WINDOW + 1)  # step numbers; run.step: steps completed
    ages = replay_ages(url, run.id, first)
    if ages.empty:
        where = "yet" if first == 1 else f"in steps {first} on (tick *All steps* for earlier ones)"
        st.info(f"Run {run['name']} has replayed no trajectory {where}: ages and importance weights appear once "
                "replay is on and the pool holds experience.")
        return
    replayed = int(ages.replayed.sum())
    mean_age = float((ages.age * ages.replayed).sum() / replayed)
    st.caption(f"Steps {first} to {int(run.step)}" + ("" if first == 1 else " (*All steps*: the whole run)"))
    cols = st.columns(3)
    cols[0].metric("replayed trajectories", replayed)
    cols[1].metric("mean age (steps)", f"{mean_age:.2f}")
    cols[2].metric("oldest replayed (steps)", int(ages.age.max()))
    st.altair_chart(age_heatmap(ages), width="stretch")
    st.caption("Age = the replaying step minus the step whose policy sampled the trajectory (its behaviour "
               "log-probs are that policy's); older trajectories are further off-policy.")

    m = ui.metric_series(url, (run.id,), (*W, *FW, *AGE, M.REPLAYED_SAMPLES))
    steps = m.loc[(m.key == M.REPLAYED_SAMPLES) & (m.value > 0), "step"]
    m = m[m.step.isin(steps) & (m.key != M.REPLAYED_SAMPLES) & (m.step >= first)]  # steps that replayed
    names = {**W, **FW, **AGE}
    m = m.assign(series=m.key.map(names))
    left, right = st.columns(2)
    left.altair_chart(charts.lines(m[m.key.isin(W)], "value", "series", "importance weight w = π_θ / π_behaviour "
                                   "of replayed tokens", "w"), width="stretch")
    right.altair_chart(charts.lines(m[m.key.isin(FW)], "value", "series", "shaped weight f(w) = w / (w + β)",
                                    "f(w)"), width="stretch")
    st.caption("Quantiles over the step's replayed tokens under the policy at the step's start (before its "
               "first update). f(w) is what the replay term applies; with policy shaping it stays below 1.")
    st.altair_chart(charts.lines(m[m.key.isin(AGE)], "value", "series", "age of replayed trajectories per step",
                                 "steps"), width="stretch")


with ui.explained():
    render()
