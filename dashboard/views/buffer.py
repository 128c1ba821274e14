"""Buffer: questions and trajectories in the replay pool, the retired set and the correctness buckets
over steps (ExGRPO §3.2), when replay was active, and the importance-weight statistics (§3.3)."""

import pandas as pd
import streamlit as st

from dashboard import charts, db, ui
from exgrpo_core import metrics as M

SIZES = {M.BUFFER_QUESTIONS: "pool questions", M.BUFFER_TRAJECTORIES: "pool trajectories",
         M.RETIRED_QUESTIONS: "retired questions"}
WEIGHTS = {M.IW_MEAN: "w mean", M.IW_MAX: "w max", M.IW_VAR: "w variance", M.SHAPED_IW_MEAN: "f(w) mean"}


def render() -> None:
    st.title("Buffer")
    url = db.database_url()
    ui.sidebar(url)
    run = ui.pick_run(ui.runs_or_stop(url))
    K = int(run.group_size)
    start = None if pd.isna(run.replay_started_step) else int(run.replay_started_step)
    keys = (*SIZES, *WEIGHTS, M.REPLAYED_SAMPLES, *(M.bucket_key(k) for k in range(K + 1)))
    m = ui.metric_series(url, (run.id,), keys)
    if m.empty:
        st.info(f"Run {run['name']} has not completed a step yet: the buffer fills in after its first step.")
        return
    last = m[m.step == m.step.max()].set_index("key")["value"]
    cols = st.columns(4)
    for col, (key, label) in zip(cols, SIZES.items()):
        col.metric(label, f"{last.get(key, float('nan')):.0f}")
    cols[3].metric("replay on since step", str(start) if start is not None else "never")
    if start is None:
        st.info("Replay never became active in this run: it stays on-policy until a step's fraction of correct "
                "rollouts passes `buffer.start_threshold`. Buckets and retired "
                "questions are still tracked; the pool starts collecting once replay is on.")
    elif m.loc[m.key == M.REPLAYED_SAMPLES, "value"].sum() == 0:
        st.info(f"Replay is on since step {start}, but no trajectory has been replayed yet: the pool is still "
                "empty, or `buffer.replay_ratio` is 0 (plain on-policy GRPO).")

    sizes = m[m.key.isin(SIZES)].assign(series=lambda d: d.key.map(SIZES))
    st.altair_chart(charts.lines(sizes, "value", "series", "replay pool and retired set", "count", start),
                    width="stretch")
    buckets = m[m.key.str.startswith("buffer/bucket_")]
    buckets = buckets.assign(k=buckets.key.str.rsplit("_", n=1).str[1].astype(int), questions=buckets.value)
    st.altair_chart(charts.bucket_area(buckets[["step", "k", "questions"]], K, start), width="stretch")
    st.caption("Each verified question sits in bucket k = correct responses of its latest group of K = "
               f"{K}; k = {K} questions are retired, k = 0 ones carry no signal. The paper replays medium "
               "buckets most (Gaussian weights centred on Acc = 0.5).")

    now = ui.buffer_now(url, run.id)
    now["bucket"] = now["k"].map(lambda k: "not verified yet" if pd.isna(k) else f"k = {int(k)}")
    with st.expander("Question states now (from the database)", expanded=False):
        st.dataframe(now[["bucket", "questions", "pooled", "trajectories", "retired"]], hide_index=True,
                     width="stretch")

    st.subheader("Importance weights of replayed tokens")
    replayed_steps = m.loc[(m.key == M.REPLAYED_SAMPLES) & (m.value > 0), "step"]
    weights = m[m.key.isin(WEIGHTS) & m.step.isin(replayed_steps)].dropna(subset=["value"])
    weights = weights.assign(series=weights.key.map(WEIGHTS))  # only steps that trained on replayed tokens
    if weights.empty:
        st.info("No replayed tokens were trained on yet, so there are no importance weights "
                "w = π_θ / π_behaviour to show.")
    else:
        left, right = st.columns(2)
        means = weights[weights.key.isin([M.IW_MEAN, M.SHAPED_IW_MEAN])]
        left.altair_chart(charts.lines(means, "value", "series", "mean w and shaped f(w) = w/(w+β)", "value",
                                       start), width="stretch")
        left.caption("f(w) mean near w/(w+β) at w≈1 (0.91 for β = 0.1) means replayed tokens stay close to "
                     "the current policy.")
        spread = weights[weights.key.isin([M.IW_MAX, M.IW_VAR])]
        right.altair_chart(charts.lines(spread, "value", "series", "largest w and variance of w per step", "value",
                                        start), width="stretch")
    replayed = m[m.key == M.REPLAYED_SAMPLES].assign(series="replayed samples")
    st.altair_chart(charts.lines(replayed, "value", "series", "replayed trajectories per step", "samples", start),
                    width="stretch")


with ui.explained():
    render()
