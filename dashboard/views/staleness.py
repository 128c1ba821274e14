"""Staleness: how old the replayed trajectories are, and how far the current policy has moved from the
policies that sampled them (importance weights w and the shaped f(w) the loss applies); with `rollout.overlap`,
how old each step's fresh batch is beside them. docs/monitors.md, docs/overlap.md."""

import altair as alt
import pandas as pd
import streamlit as st

from dashboard import charts, db, monitor_queries, ui
from exgrpo_core import metrics as M

W = {M.REPLAY_W_P10: "w p10", M.REPLAY_W_P50: "w median", M.REPLAY_W_P90: "w p90", M.REPLAY_W_MAX: "w max"}
FW = {M.REPLAY_FW_P10: "f(w) p10", M.REPLAY_FW_P50: "f(w) median", M.REPLAY_FW_P90: "f(w) p90"}
AGE = {M.REPLAY_AGE_MEAN: "mean age", M.REPLAY_AGE_MAX: "max age"}
FRESH = {M.FRESH_STALENESS: "fresh batch"}
WINDOW = 50  # steps of the age heat map by default: one trajectory lookup per replay
replay_ages = st.cache_data(ttl=ui.TTL_S, show_spinner="loading...")(monitor_queries.replay_ages)


def age_heatmap(ages: pd.DataFrame) -> alt.Chart:
    """Replayed trajectories per (step, age): each column is one step's age distribution."""
    return alt.Chart(ages, title="replayed trajectories by age (steps since they were sampled)").mark_rect().encode(
        x=alt.X("step:O", title="step"), y=alt.Y("age:O", title="age (steps)", sort="descending"),
        color=alt.Color("replayed:Q", title="replayed", scale=alt.Scale(scheme="blues")),
        tooltip=["step:Q", "age:Q", "replayed:Q"]).properties(height=charts.HEIGHT)


def per_step_ages(url: str, run_id: str, first: int, replayed: pd.DataFrame | None) -> None:
    """The fresh batch's staleness per step (logged with rollout.overlap) beside the replayed trajectories'
    mean and max age (`replayed`: AGE rows of the steps that replayed), one chart, with its caption."""
    fresh = ui.metric_series(url, (run_id,), (M.FRESH_STALENESS, M.FRESH_DROPPED))
    fresh = fresh[fresh.step >= first]
    ages = fresh[fresh.key == M.FRESH_STALENESS].assign(series=FRESH[M.FRESH_STALENESS])
    shown = [w for w, rows in (("the fresh batch", ages), ("replayed trajectories", replayed))
             if rows is not None and not rows.empty]
    if not shown:
        return
    if replayed is not None:
        ages = pd.concat([ages, replayed.assign(series=replayed.key.map(AGE))])
    st.altair_chart(charts.lines(ages, "value", "series", f"age of {' and '.join(shown)} per step", "steps"),
                    width="stretch")
    if fresh.empty:
        return
    dropped = int(fresh.loc[fresh.key == M.FRESH_DROPPED, "value"].sum())
    st.caption("Fresh batch (`rollout.overlap`): steps from the policy that sampled the step's fresh rollouts to "
               "the one that trains on them; 0 is on-policy, 1 sampled one step ahead. It never exceeds "
               f"`rollout.max_staleness`: an older batch is dropped and sampled again ({dropped} in these steps).")


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
        per_step_ages(url, run.id, first, None)
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
    per_step_ages(url, run.id, first, m[m.key.isin(AGE)])


with ui.explained():
    render()
