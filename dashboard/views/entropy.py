"""Entropy: distributions of trajectory entropy H(o) (docs/implementation_details.md) at a chosen step range, as in the
paper's analysis (§4): correct vs incorrect, fresh vs replayed, by correctness bucket; and the mean
entropy of replayed trajectories over steps (low-entropy selection, §3.2). Several runs are overlaid."""

import pandas as pd
import streamlit as st

from dashboard import charts, ui
from dashboard.queries import ENTROPY_DEFAULT_STEPS
from exgrpo_core import metrics as M

STATS_FORMAT = {c: st.column_config.NumberColumn(format="%.4f") for c in ("mean entropy", "std", "min", "max")}


def histograms(url: str, chosen: pd.DataFrame, names: dict[str, str], lo: int, hi: int, by: str) -> pd.DataFrame:
    """The runs' SQL histograms, with a `run` column when there are several."""
    parts = [ui.entropy_histogram(url, rid, lo, hi, by, ui.continuous_rewards(url, rid)).assign(run=names[rid])
             for rid in chosen["id"]]
    hist = pd.concat(parts, ignore_index=True)
    return hist if len(chosen) > 1 else hist.drop(columns="run")


def _section(url: str, chosen: pd.DataFrame, names: dict[str, str], lo: int, hi: int, by: str,
             title: str) -> pd.DataFrame:
    hist = histograms(url, chosen, names, lo, hi, by)
    if hist.empty:
        st.info(f"No trajectories with an entropy at steps {lo}-{hi}.")
        return hist
    bins = charts.merge_bins(hist)
    stats = charts.group_stats(hist)
    if by == "bucket":
        st.altair_chart(charts.violins(bins, stats, title, "bucket k of the group"), width="content")
        st.caption("Each violin is drawn from its bucket's smallest to its largest entropy, one band per bin that "
                   "holds trajectories, widest bin at full width; the black tick is the mean"
                   + (" (runs side by side, in the order picked)." if "run" in bins else "."))
    elif "run" in bins:  # several runs: one panel per group, the runs overlaid in each
        groups = sorted(bins["group"].unique())
        for col, group in zip(st.columns(len(groups)), groups):
            col.altair_chart(charts.histogram(bins[bins.group == group], group, color="run",
                                              domain=[names[r] for r in chosen["id"]]), width="stretch")
    else:
        st.altair_chart(charts.histogram(bins, title), width="stretch")
    st.dataframe(stats, hide_index=True, width="stretch", column_config=STATS_FORMAT)
    return hist


def _replayed_over_steps(url: str, chosen: pd.DataFrame, names: dict[str, str]) -> None:
    st.subheader("Replayed trajectories over steps")
    multi, parts, any_replay = len(chosen) > 1, [], False
    for run in chosen.itertuples():
        replays = ui.replay_entropy_by_step(url, run.id)
        fresh = ui.metric_series(url, (run.id,), (M.FRESH_ENTROPY,))
        any_replay |= not replays.empty
        parts += [replays.rename(columns={"mean_entropy": "value"}).assign(series="replayed (lowest H)"),
                  fresh.assign(series="fresh (mean)")]
        parts[-2:] = [d.assign(run=names[run.id]) for d in parts[-2:]]
    curves = pd.concat(parts, ignore_index=True)[["step", "value", "series", "run"]]
    first = chosen.iloc[0]
    start = None if multi or pd.isna(first.replay_started_step) else int(first.replay_started_step)
    colour, dash = ("run", "series") if multi else ("series", None)  # several runs: colour = run, dash = series
    st.altair_chart(charts.lines(curves.dropna(), "value", colour, "mean entropy per step", "H (nats)", start,
                                 dash=dash, domain=[names[r] for r in chosen["id"]] if multi else None),
                    width="stretch")
    if not any_replay:
        why = ui.no_replay_reason(url, chosen, "in them" if multi else "in it")
        st.info(("These runs have" if multi else "This run has") + " not replayed any trajectory"
                + (f": {why}" if why else " yet") + "; only fresh rollouts are shown.")


def body(url: str, chosen: pd.DataFrame, names: dict[str, str]) -> None:
    bounds = [b for b in (ui.step_bounds(url, rid) for rid in chosen["id"]) if b is not None]
    if not bounds:
        st.info(f"Run {chosen.iloc[0]['name']} has no stored trajectories yet. Fresh rollouts are stored after each "
                "step when `buffer.store_all_rollouts` is on (the default); otherwise only collected experience is.")
        return
    first, last = min(b[0] for b in bounds), max(b[1] for b in bounds)
    if first == last:
        lo, hi = first, last
    else:
        default = (max(first, last - ENTROPY_DEFAULT_STEPS + 1), last)
        key = ui.option("steps", default, parse=lambda s: tuple(int(x) for x in s.split("-")))
        lo, hi = st.session_state[key]
        if not first <= lo <= hi <= last:
            st.session_state[key] = default
        lo, hi = st.slider("sampled in steps", first, last, key=key)
        ui.remember("steps", f"{lo}-{hi}")
    st.caption(f"Trajectories sampled in steps {lo}-{hi} (by the policy after steps {lo - 1}-{hi - 1}). "
               "H(o) is the mean over the response's "
               "tokens of the full next-token distribution's entropy; replayed ones are measured again under "
               "the policy at replay time. Each histogram reads every trajectory of the range (from an index), so a "
               "wide range on a run with a million trajectories takes seconds.")

    continuous = any(ui.continuous_rewards(url, rid) for rid in chosen["id"])
    st.subheader("Above vs at or below the group's mean reward" if continuous else "Correct vs incorrect")
    if continuous:
        st.caption("Continuous rewards: a rollout counts as a success (stored as experience) when its reward is "
                   "above the mean of its group's; buckets are reward-spread buckets (docs/rewards.md).")
    _section(url, chosen, names, lo, hi, "correct", "fresh rollouts by reward")
    st.subheader("Fresh vs replayed")
    hist = _section(url, chosen, names, lo, hi, "source", "fresh rollouts and replayed experience")
    if not hist.empty and "replayed" not in set(hist["group"]):
        why = ui.no_replay_reason(url, chosen, "in this run" if len(chosen) == 1 else "in these runs")
        st.info("Nothing was replayed in this step range" + (f": {why}" if why else "") + ".")
    st.subheader("By bucket")
    _section(url, chosen, names, lo, hi, "bucket", "entropy by the k of the group each rollout was verified in")
    _replayed_over_steps(url, chosen, names)


def render() -> None:
    ui.overlay_page("Entropy", body)


with ui.explained():
    render()
