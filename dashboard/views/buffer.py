"""Buffer: questions and trajectories in the replay pool, the retired set and the correctness buckets
over steps (ExGRPO §3.2), replays per source bucket against the question-selection weights, when replay
was active, and the importance-weight statistics (§3.3). Several runs are drawn side by side."""

import pandas as pd
import streamlit as st

from dashboard import charts, ui
from dashboard import monitor_banner
from exgrpo_core import metrics as M

SIZES = {M.BUFFER_QUESTIONS: "pool questions", M.BUFFER_TRAJECTORIES: "pool trajectories",
         M.RETIRED_QUESTIONS: "retired questions"}
WEIGHTS = {M.IW_MEAN: "w mean", M.IW_MAX: "w max", M.IW_VAR: "w variance", M.SHAPED_IW_MEAN: "f(w) mean"}
BUCKET_VIEWS = ["lines per bucket", "stacked"]


def _start(run) -> int | None:
    return None if pd.isna(run.replay_started_step) else int(run.replay_started_step)


def _curves(m: pd.DataFrame, keys: dict, multi: bool) -> tuple[pd.DataFrame, str, str | None]:
    """Rows of `keys` with a `series` label; colour by series for one run, by run (dash = series) for several."""
    d = m[m.key.isin(keys)].assign(series=lambda x: x.key.map(keys))
    return (d, "run", "series") if multi else (d, "series", None)


def _headline(run, m: pd.DataFrame, label: str | None, ratio: float | None) -> None:
    if label:
        st.markdown(f"**{label}**")
    last = m[m.step == m.step.max()].set_index("key")["value"]
    cols = st.columns(4)
    for col, (key, name) in zip(cols, SIZES.items()):
        col.metric(name, f"{last.get(key, float('nan')):.0f}")
    start = _start(run)
    cols[3].metric("replay on since step", str(start) if start is not None else "never")
    who = f"{run['name']}: r" if label else "R"
    if ratio == 0:
        st.info(f"{who}eplay is off in this run: `buffer.replay_ratio` is 0 (plain on-policy GRPO). Buckets and "
                "retired questions are still tracked.")
    elif start is None:
        st.info(f"{who}eplay never became active in this run: it stays on-policy until a step's fraction of correct "
                "rollouts passes `buffer.start_threshold`. Buckets and retired "
                "questions are still tracked; the pool starts collecting once replay is on.")
    elif m.loc[m.key == M.REPLAYED_SAMPLES, "value"].sum() == 0:  # ratio 0 took the first branch
        st.info(f"{who}eplay is on since step {start}, but no trajectory has been replayed yet: the pool is still "
                "empty (it collects correct responses of questions with 0 < k < K once replay is on)"
                + (", or `buffer.replay_ratio` is 0 (its config does not say)" if ratio is None else "") + ".")


def _buckets(m: pd.DataFrame, chosen: pd.DataFrame, K: int, continuous: bool = False) -> None:
    if continuous:
        return _spread_buckets(m, chosen, K)
    st.subheader("Correctness buckets")
    left, right = st.columns([1, 2])
    ends = left.toggle(f"show k = 0 and k = {K}", key=ui.option("ends", False, parse=ui.flag),
                       help="k = 0 (no correct response) usually holds most questions and k = K are retired; "
                            "hidden by default so the medium buckets the paper replays get the axis")
    ui.remember("ends", ends)
    view = right.radio("buckets drawn as", BUCKET_VIEWS, horizontal=True,
                       key=ui.option("buckets", BUCKET_VIEWS[0], choices=BUCKET_VIEWS))
    ui.remember("buckets", view)
    b = m[m.key.str.startswith("buffer/bucket_")]
    b = b.assign(k=b.key.str.rsplit("_", n=1).str[1].astype(int), questions=b.value,
                 K=b.run_id.map(dict(zip(chosen["id"], chosen["group_size"]))))
    if not ends:
        b = b[(b.k > 0) & (b.k < b.K)]  # each run's own K
    stacked = view == "stacked"
    top = (b.groupby(["run_id", "step"])["questions"].sum() if stacked else b["questions"]).max() if len(b) else 0
    title = "questions per bucket k (latest group's correct responses)"
    for col, run in zip(st.columns(len(chosen)), chosen.itertuples()):
        d = b[b.run_id == run.id][["step", "k", "questions"]]
        label = f"{run.name}: {title}" if len(chosen) > 1 else title
        col.altair_chart(charts.buckets(d, K, _start(run), stacked, label, y_max=float(top) or None),
                         width="stretch")
    st.caption("Each verified question sits in bucket k = correct responses of its latest group of K = "
               f"{K}; k = {K} questions are retired, k = 0 ones carry no signal"
               + ("" if ends else f" (both hidden: switch on 'show k = 0 and k = {K}')") +
               ". The paper replays medium buckets most (Gaussian weights centred on Acc = 0.5).")


def _spread_buckets(m: pd.DataFrame, chosen: pd.DataFrame, K: int) -> None:
    """Continuous rewards: buckets 0..K are the normalised reward spread of each question's latest group."""
    st.subheader("Reward-spread buckets")
    b = m[m.key.str.startswith("buffer/bucket_")]
    b = b.assign(k=b.key.str.rsplit("_", n=1).str[1].astype(int), questions=b.value)
    b = b[b.k > 0]
    title = "questions per bucket (round(normalised reward spread x K))"
    top = float(b["questions"].max()) if len(b) else 0.0
    for col, run in zip(st.columns(len(chosen)), chosen.itertuples()):
        d = b[b.run_id == run.id][["step", "k", "questions"]]
        label = f"{run.name}: {title}" if len(chosen) > 1 else title
        col.altair_chart(charts.buckets(d, K, _start(run), False, label, y_max=top or None), width="stretch")
    st.caption(f"Continuous rewards: bucket = round(max((σ - σ_min) / (σ_max - σ_min), ε) × {K}), σ the spread of a "
               f"question's latest group's rewards over the step's questions; bucket {K} holds the most spread "
               "groups (drawable, not retired), bucket 0 (hidden) the flattest. Retired questions (every reward 1) "
               "are counted in the retired set, not here (docs/rewards.md).")


def _replay_targets(url: str, chosen: pd.DataFrame, names: dict[str, str]) -> None:
    st.subheader("Question selection: replays per bucket vs target")
    rows, notes = [], []
    for run in chosen.itertuples():
        counts = ui.replay_buckets(url, run.id)
        weights, weighting = ui.target_weights(url, run.id)
        total = int(counts["replayed"].sum())
        if total == 0:
            why = ui.no_replay_reason(url, chosen[chosen.id == run.id], "in it")
            notes.append(f"{names[run.id]} has replayed nothing: {why}." if why else
                         f"{names[run.id]} has replayed nothing yet.")
        got = dict(zip(counts["k"], counts["replayed"]))
        for k in sorted(set(got) | set(weights)):
            rows.append({"run": names[run.id], "k": k, "replayed": got.get(k, 0),
                         "share": got.get(k, 0) / total if total else float("nan"),
                         "target": weights.get(k, float("nan")), "weighting": weighting})
    table = pd.DataFrame(rows, columns=["run", "k", "replayed", "share", "target", "weighting"])
    if table["replayed"].sum() == 0:
        st.info("No run selected here has replayed a question yet." + (" " + " ".join(notes) if notes else ""))
        return
    st.altair_chart(charts.replay_vs_target(table.dropna(subset=["share"])), width="stretch")
    st.caption("Each replayed question counted in the bucket it was drawn from (its latest k before the replay); "
               "the target is the run's `selection` weights w(k/K) normalised over k = 1..K-1. A share below "
               "target means that bucket was often empty or short. " + " ".join(notes))
    with st.expander("Replays per bucket (table)", expanded=False):
        st.dataframe(table, hide_index=True, width="stretch",
                     column_config={"share": st.column_config.NumberColumn(format="percent"),
                                    "target": st.column_config.NumberColumn(format="percent")})


def _weights(m: pd.DataFrame, multi: bool, start: int | None) -> None:
    st.subheader("Importance weights of replayed tokens")
    replayed = m[(m.key == M.REPLAYED_SAMPLES) & (m.value > 0)][["run_id", "step"]]
    w = m[m.key.isin(WEIGHTS)].merge(replayed, on=["run_id", "step"]).dropna(subset=["value"])
    if w.empty:  # only steps that trained on replayed tokens
        st.info("No replayed tokens were trained on yet, so there are no importance weights "
                "w = π_θ / π_behaviour to show.")
        return
    left, right = st.columns(2)
    means, colour, dash = _curves(w, {M.IW_MEAN: WEIGHTS[M.IW_MEAN], M.SHAPED_IW_MEAN: WEIGHTS[M.SHAPED_IW_MEAN]},
                                  multi)
    left.altair_chart(charts.lines(means, "value", colour, "mean w and shaped f(w) = w/(w+β)", "value", start,
                                   dash=dash), width="stretch")
    left.caption("f(w) mean near w/(w+β) at w≈1 (0.91 for β = 0.1) means replayed tokens stay close to "
                 "the current policy.")
    spread, colour, dash = _curves(w, {M.IW_MAX: WEIGHTS[M.IW_MAX], M.IW_VAR: WEIGHTS[M.IW_VAR]}, multi)
    right.altair_chart(charts.lines(spread, "value", colour, "largest w and variance of w per step", "value", start,
                                    dash=dash), width="stretch")


def body(url: str, chosen: pd.DataFrame, names: dict[str, str]) -> None:
    multi = len(chosen) > 1
    K = int(chosen["group_size"].max())
    keys = (*SIZES, *WEIGHTS, M.REPLAYED_SAMPLES, *(M.bucket_key(k) for k in range(K + 1)))
    m = ui.metric_series(url, tuple(chosen["id"]), keys)
    m["run"] = m["run_id"].map(names)
    for run in chosen.itertuples():
        mine = m[m.run_id == run.id]
        if mine.empty:
            st.info(f"Run {run.name} has not completed a step yet: the buffer fills in after its first step.")
        else:
            _headline(chosen[chosen.id == run.id].iloc[0], mine, names[run.id] if multi else None,
                      ui.replay_ratio(url, run.id))
    if m.empty:
        return
    start = None if multi else _start(chosen.iloc[0])  # one replay-start rule per chart, for one run only

    left, right = st.columns(2)
    questions, colour, dash = _curves(m, {M.BUFFER_QUESTIONS: SIZES[M.BUFFER_QUESTIONS],
                                          M.RETIRED_QUESTIONS: SIZES[M.RETIRED_QUESTIONS]}, multi)
    left.altair_chart(charts.lines(questions, "value", colour, "replay pool and retired set (questions)",
                                   "questions", start, dash=dash), width="stretch")
    trajs, colour, _ = _curves(m, {M.BUFFER_TRAJECTORIES: SIZES[M.BUFFER_TRAJECTORIES]}, multi)
    right.altair_chart(charts.lines(trajs, "value", colour, "trajectories in the replay pool", "trajectories",
                                    start), width="stretch")
    _buckets(m, chosen, K, any(ui.continuous_rewards(url, rid) for rid in chosen["id"]))
    _replay_targets(url, chosen, names)

    now = pd.concat([ui.buffer_now(url, run_id).assign(run=names[run_id]) for run_id in chosen["id"]],
                    ignore_index=True)
    now["bucket"] = now["k"].map(lambda k: "not verified yet" if pd.isna(k) else f"k = {int(k)}")
    with st.expander("Question states now (from the database)", expanded=False):
        st.dataframe(now[[*(["run"] if multi else []), "bucket", "questions", "pooled", "trajectories", "retired"]],
                     hide_index=True, width="stretch")

    _weights(m, multi, start)
    replayed, colour, _ = _curves(m, {M.REPLAYED_SAMPLES: "replayed samples"}, multi)
    st.altair_chart(charts.lines(replayed, "value", colour, "replayed trajectories per step", "samples", start),
                    width="stretch")


def render() -> None:
    ui.overlay_page("Buffer", body, before=lambda url, chosen: monitor_banner.render(url, tuple(chosen.id)))


with ui.explained():
    render()
