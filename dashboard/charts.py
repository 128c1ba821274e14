"""Altair charts in the style of the paper's figures, built from the frames `queries` returns.

Histograms arrive as fixed-width SQL bins (`queries.BIN_WIDTH`); `merge_bins` turns them into at
most ~40 display bins with densities, so groups of different sizes share one axis. Violins are drawn
from the same bins (mirrored density areas), so no chart needs the raw trajectories.
"""

from __future__ import annotations

import math

import altair as alt
import numpy as np
import pandas as pd

from dashboard.queries import BIN_WIDTH

HEIGHT = 260
STEP_AXIS = alt.Axis(format="d", tickMinStep=1)


def merge_bins(hist: pd.DataFrame, max_bins: int = 40) -> pd.DataFrame:
    """SQL bins [group, bin, n, sum, sumsq] -> display bins [group, entropy, start, end, n, density].

    `entropy` is the bin centre, `density` is per nat within the group (each group integrates to 1).
    """
    if hist.empty:
        return pd.DataFrame(columns=["group", "entropy", "start", "end", "n", "density"])
    lo, hi = int(hist["bin"].min()), int(hist["bin"].max())
    factor = max(1, math.ceil((hi - lo + 1) / max_bins))
    width = factor * BIN_WIDTH
    out = hist.assign(dbin=(hist["bin"] - lo) // factor).groupby(["group", "dbin"], as_index=False)["n"].sum()
    totals = out.groupby("group")["n"].transform("sum")
    out["start"] = lo * BIN_WIDTH + out["dbin"] * width
    out["end"] = out["start"] + width
    out["entropy"] = out["start"] + width / 2
    out["density"] = out["n"] / totals / width
    return out[["group", "entropy", "start", "end", "n", "density"]]


def group_stats(hist: pd.DataFrame) -> pd.DataFrame:
    """Per group: trajectories, mean and standard deviation of entropy, exact (from SQL sums)."""
    g = hist.groupby("group")[["n", "sum", "sumsq"]].sum()
    mean = g["sum"] / g["n"]
    std = np.sqrt((g["sumsq"] / g["n"] - mean ** 2).clip(lower=0))
    return pd.DataFrame({"trajectories": g["n"].astype(int), "mean entropy": mean, "std": std}).reset_index()


def histogram(bins: pd.DataFrame, title: str) -> alt.Chart:
    """Overlaid density histograms of entropy, one colour per group."""
    return alt.Chart(bins, title=title).mark_bar(opacity=0.55, binSpacing=0).encode(
        x=alt.X("start:Q", title="trajectory entropy H(o) (nats)", bin=alt.Bin(binned=True)), x2="end:Q",
        y=alt.Y("density:Q", title="density", stack=None),
        color=alt.Color("group:N", title=None, scale=alt.Scale(scheme="tableau10")),
        tooltip=["group:N", alt.Tooltip("entropy:Q", format=".3f"), "n:Q", alt.Tooltip("density:Q", format=".3f")],
    ).properties(height=HEIGHT)


def violins(bins: pd.DataFrame, title: str, group_title: str) -> alt.Chart:
    """One violin per group: the binned density mirrored around the group's axis."""
    return alt.Chart(bins).mark_area(orient="horizontal", interpolate="step").encode(
        y=alt.Y("entropy:Q", title="trajectory entropy H(o) (nats)"),
        x=alt.X("density:Q", stack="center", axis=None),
        color=alt.Color("group:N", legend=None, scale=alt.Scale(scheme="tableau10")),
        column=alt.Column("group:N", title=group_title, header=alt.Header(labelOrient="bottom")),
        tooltip=["group:N", alt.Tooltip("entropy:Q", format=".3f"), "n:Q"],
    ).properties(width=70, height=HEIGHT, title=title).configure_facet(spacing=4)


def lines(df: pd.DataFrame, y: str, color: str, title: str, y_title: str | None = None,
          marker_step: int | None = None) -> alt.LayerChart | alt.Chart:
    """Metric curves over training steps; `marker_step` draws the replay-start rule."""
    chart = alt.Chart(df, title=title).mark_line(point=len(df) < 60).encode(
        x=alt.X("step:Q", title="step", axis=STEP_AXIS), y=alt.Y(f"{y}:Q", title=y_title or y),
        color=alt.Color(f"{color}:N", title=None, scale=alt.Scale(scheme="tableau10")),
        tooltip=[f"{color}:N", "step:Q", alt.Tooltip(f"{y}:Q", format=".4g")],
    ).properties(height=HEIGHT)
    return chart + replay_rule(marker_step) if marker_step is not None else chart


def replay_rule(step: int) -> alt.LayerChart:
    """A dashed vertical line with a label at the step replay switched on."""
    df = pd.DataFrame({"step": [step], "label": [f"replay on (step {step})"]})
    rule = alt.Chart(df).mark_rule(strokeDash=[4, 3], color="#444").encode(x="step:Q")
    label = alt.Chart(df).mark_text(align="left", dx=4, dy=-6, color="#444").encode(
        x="step:Q", y=alt.value(8), text="label:N")
    return rule + label


def bucket_area(df: pd.DataFrame, group_size: int, marker_step: int | None) -> alt.LayerChart | alt.Chart:
    """Stacked area of questions per correctness bucket k = 0..K over steps (df: [step, k, questions])."""
    chart = alt.Chart(df, title="questions per bucket k (latest group's correct responses)").mark_area().encode(
        x=alt.X("step:Q", title="step", axis=STEP_AXIS), y=alt.Y("questions:Q", stack="zero", title="questions"),
        color=alt.Color("k:O", title="k", scale=alt.Scale(scheme="viridis", domain=list(range(group_size + 1)))),
        order=alt.Order("k:O"), tooltip=["step:Q", "k:O", "questions:Q"],
    ).properties(height=HEIGHT + 40)
    return chart + replay_rule(marker_step) if marker_step is not None else chart


def group_history(df: pd.DataFrame, group_size: int) -> alt.Chart:
    """k per step of one question's groups, fresh and replayed groups marked apart."""
    d = df.assign(group=np.where(df["is_replay"], "mixed (replay)", "fresh"))
    return alt.Chart(d, title="k correct of K per group").mark_line(point=True).encode(
        x=alt.X("step:Q", axis=STEP_AXIS), y=alt.Y("k:Q", scale=alt.Scale(domain=[0, group_size])),
        color=alt.Color("group:N", title=None), tooltip=["step:Q", "k:Q", "n:Q", "group:N"],
    ).properties(height=200)
