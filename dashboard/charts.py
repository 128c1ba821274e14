"""Altair charts in the style of the paper's figures, built from the frames `queries` returns.

Histograms arrive as fixed-width SQL bins (`queries.BIN_WIDTH`); `merge_bins` turns them into at
most ~40 display bins with densities, so groups of different sizes share one axis. Violins are drawn
from the same bins as rectangles (one per non-empty bin, clipped to the group's min..max), so no chart
needs the raw trajectories and none draws entropy a group does not have.
"""

from __future__ import annotations

import math

import altair as alt
import numpy as np
import pandas as pd

from dashboard.queries import BIN_WIDTH

HEIGHT = 260
STEP_AXIS = alt.Axis(format="d", tickMinStep=1)


def _keys(hist: pd.DataFrame) -> list[str]:
    return ["run", "group"] if "run" in hist.columns else ["group"]


def merge_bins(hist: pd.DataFrame, max_bins: int = 40) -> pd.DataFrame:
    """SQL bins [(run,) group, bin, n, sum, sumsq, lo, hi] -> display bins [(run,) group, entropy, start, end,
    n, density, lo, hi].

    `entropy` is the bin centre, `density` is per nat within the group (each group integrates to 1), lo/hi
    the smallest and largest entropy in the display bin. All groups (and runs) share one set of bins.
    """
    keys = _keys(hist)
    if hist.empty:
        return pd.DataFrame(columns=[*keys, "entropy", "start", "end", "n", "density", "lo", "hi"])
    lo, hi = int(hist["bin"].min()), int(hist["bin"].max())
    factor = max(1, math.ceil((hi - lo + 1) / max_bins))
    width = factor * BIN_WIDTH
    out = (hist.assign(dbin=(hist["bin"] - lo) // factor).groupby([*keys, "dbin"], as_index=False)
           .agg(n=("n", "sum"), lo=("lo", "min"), hi=("hi", "max")))
    totals = out.groupby(keys)["n"].transform("sum")
    out["start"] = lo * BIN_WIDTH + out["dbin"] * width
    out["end"] = out["start"] + width
    out["entropy"] = out["start"] + width / 2
    out["density"] = out["n"] / totals / width
    return out[[*keys, "entropy", "start", "end", "n", "density", "lo", "hi"]]


def group_stats(hist: pd.DataFrame) -> pd.DataFrame:
    """Per group: trajectories, mean and standard deviation of entropy (exact, from SQL sums), min and max."""
    g = hist.groupby(_keys(hist)).agg(n=("n", "sum"), sum=("sum", "sum"), sumsq=("sumsq", "sum"),
                                      lo=("lo", "min"), hi=("hi", "max"))
    mean = g["sum"] / g["n"]
    std = np.sqrt((g["sumsq"] / g["n"] - mean ** 2).clip(lower=0))
    return pd.DataFrame({"trajectories": g["n"].astype(int), "mean entropy": mean, "std": std,
                         "min": g["lo"], "max": g["hi"]}).reset_index()


LEGEND = alt.Legend(title=None, labelLimit=400)  # run names in full (Vega cuts labels at 160 px by default)


def histogram(bins: pd.DataFrame, title: str, color: str = "group", domain: list[str] | None = None) -> alt.Chart:
    """Overlaid density histograms of entropy, one colour per `color` value (group, or run); `domain` (every
    run shown on the page) keeps a run's colour the same in every panel, whichever runs a panel holds."""
    scale = alt.Scale(scheme="tableau10", domain=domain) if domain else alt.Scale(scheme="tableau10")
    return alt.Chart(bins, title=title).mark_bar(opacity=0.55, binSpacing=0).encode(
        x=alt.X("start:Q", title="trajectory entropy H(o) (nats)", bin=alt.Bin(binned=True)), x2="end:Q",
        y=alt.Y("density:Q", title="density", stack=None),
        color=alt.Color(f"{color}:N", title=None, scale=scale, legend=LEGEND),
        tooltip=[f"{color}:N", alt.Tooltip("entropy:Q", format=".3f"), "n:Q", alt.Tooltip("density:Q", format=".3f")],
    ).properties(height=HEIGHT)


VIOLIN_HALF_WIDTH = 0.45  # of a run's slot; every violin's widest bin is drawn this wide


def violin_shapes(bins: pd.DataFrame) -> pd.DataFrame:
    """Rectangles of binned violins: one per display bin, [(run,) group, y0, y1, x0, x1, n, density].

    Each bin is drawn over its own entropy range, clipped to the group's smallest and largest entropy, so a
    violin spans exactly its group's min..max and nothing where the group has no trajectory (empty bins get
    no rectangle). Widths are scaled per violin (widest bin = `VIOLIN_HALF_WIDTH` each side of the slot
    centre), so a narrow group and a wide one are both readable; runs sit side by side, slot i at x = i.
    """
    keys = _keys(bins)
    if bins.empty:
        return pd.DataFrame(columns=[*keys, "y0", "y1", "x0", "x1", "n", "density"])
    g = bins.groupby(keys)
    half = VIOLIN_HALF_WIDTH * bins["density"] / g["density"].transform("max")
    centre = bins["run"].map({r: i for i, r in enumerate(dict.fromkeys(bins["run"]))}) if "run" in keys else 0
    return bins[keys].assign(y0=np.maximum(bins["start"], g["lo"].transform("min")),
                             y1=np.minimum(bins["end"], g["hi"].transform("max")),
                             x0=centre - half, x1=centre + half, n=bins["n"], density=bins["density"])


def violins(bins: pd.DataFrame, stats: pd.DataFrame, title: str, group_title: str) -> alt.FacetChart:
    """One binned violin per group (and run, side by side), with a tick at each violin's mean."""
    keys = _keys(bins)
    shapes = violin_shapes(bins).assign(mark="bin")
    shapes["what"] = "violin " + shapes["group"].astype(str) + (" | " + shapes["run"] if "run" in keys else "")
    runs = list(dict.fromkeys(bins["run"])) if "run" in keys else [None]
    slot = {r: i for i, r in enumerate(runs)}
    means = stats.assign(mark="mean", y0=stats["mean entropy"], y1=stats["mean entropy"],
                         x0=(stats["run"].map(slot) if "run" in keys else 0) - VIOLIN_HALF_WIDTH,
                         n=stats["trajectories"])
    means["x1"] = means["x0"] + 2 * VIOLIN_HALF_WIDTH
    data = pd.concat([shapes, means[[*keys, "mark", "y0", "y1", "x0", "x1", "n"]]], ignore_index=True)
    data["group"] = data["group"].astype(str)
    colour = "run" if len(runs) > 1 else "group"
    x = alt.X("x0:Q", axis=None, scale=alt.Scale(domain=[-0.5, len(runs) - 0.5]))
    y = alt.Y("y0:Q", title="trajectory entropy H(o) (nats)")
    tip = [*(f"{k}:N" for k in keys), alt.Tooltip("y0:Q", title="from", format=".3f"),
           alt.Tooltip("y1:Q", title="to", format=".3f"), "n:Q"]
    scale = alt.Scale(scheme="tableau10", domain=runs) if colour == "run" else alt.Scale(scheme="tableau10")
    rects = alt.Chart().mark_rect(strokeWidth=1).encode(  # the stroke keeps a one-value bin (min = max) visible
        x=x, x2="x1:Q", y=y, y2="y1:Q", tooltip=tip, description="what:N",  # aria-label: "violin <group>[ | <run>]"
        color=alt.Color(f"{colour}:N", legend=LEGEND if colour == "run" else None, scale=scale),
        stroke=alt.Stroke(f"{colour}:N", legend=None, scale=scale),
    ).transform_filter(alt.datum.mark == "bin")
    ticks = alt.Chart().mark_rule(color="black", strokeWidth=2).encode(
        x=x, x2="x1:Q", y=y, tooltip=[*(f"{k}:N" for k in keys), alt.Tooltip("y0:Q", title="mean", format=".4f")],
    ).transform_filter(alt.datum.mark == "mean")
    return alt.layer(rects, ticks, data=data).properties(width=max(70, 45 * len(runs)), height=HEIGHT).facet(
        column=alt.Column("group:N", title=group_title, header=alt.Header(labelOrient="bottom"),
                          sort=sorted(set(bins["group"]), key=_natural)),
        title=title,
    ).configure_facet(spacing=4)


def _natural(label: str):
    return (0, int(label)) if str(label).isdigit() else (1, str(label))


def lines(df: pd.DataFrame, y: str, color: str, title: str, y_title: str | None = None,
          marker_step: int | None = None, dash: str | None = None,
          domain: list[str] | None = None) -> alt.LayerChart | alt.Chart:
    """Metric curves over training steps; `dash` draws a second key as line styles (e.g. run = colour,
    series = dash); `marker_step` draws the replay-start rule; `domain` fixes the colours' order."""
    enc = dict(x=alt.X("step:Q", title="step", axis=STEP_AXIS), y=alt.Y(f"{y}:Q", title=y_title or y),
               color=alt.Color(f"{color}:N", title=None, legend=LEGEND,
                               scale=alt.Scale(scheme="tableau10", domain=domain or alt.Undefined)),
               tooltip=[f"{color}:N", *([f"{dash}:N"] if dash else []), "step:Q", alt.Tooltip(f"{y}:Q", format=".4g")])
    if dash:
        enc["strokeDash"] = alt.StrokeDash(f"{dash}:N", title=None)
    chart = alt.Chart(df, title=title).mark_line(point=len(df) < 60 and not dash).encode(**enc)
    chart = chart.properties(height=HEIGHT)
    return chart + replay_rule(marker_step) if marker_step is not None else chart


def replay_rule(step: int) -> alt.LayerChart:
    """A dashed vertical line with a label at the step replay switched on."""
    df = pd.DataFrame({"step": [step], "label": [f"replay on (step {step})"]})
    rule = alt.Chart(df).mark_rule(strokeDash=[4, 3], color="#444").encode(x="step:Q")
    label = alt.Chart(df).mark_text(align="left", dx=4, dy=-6, color="#444").encode(
        x="step:Q", y=alt.value(8), text="label:N")
    return rule + label


def buckets(df: pd.DataFrame, group_size: int, marker_step: int | None, stacked: bool, title: str,
            y_max: float | None = None) -> alt.LayerChart | alt.Chart:
    """Questions per correctness bucket k over steps (df: [step, k, questions]): one line per bucket, or
    stacked areas; the page leaves out k = 0 / k = K unless asked, so the medium buckets get the axis."""
    scale = alt.Scale(domain=[0, y_max]) if y_max else alt.Undefined
    colour = alt.Color("k:O", title="k", scale=alt.Scale(scheme="viridis", domain=list(range(group_size + 1))),
                       legend=alt.Legend(values=sorted(int(k) for k in df["k"].unique())))  # only the drawn ks
    enc = dict(x=alt.X("step:Q", title="step", axis=STEP_AXIS), color=colour, tooltip=["step:Q", "k:O", "questions:Q"])
    if stacked:
        chart = alt.Chart(df, title=title).mark_area().encode(
            y=alt.Y("questions:Q", stack="zero", title="questions", scale=scale), order=alt.Order("k:O"), **enc)
    else:
        chart = alt.Chart(df, title=title).mark_line(point=len(df) < 200).encode(
            y=alt.Y("questions:Q", title="questions", scale=scale), **enc)
    chart = chart.properties(height=HEIGHT + 40)
    return chart + replay_rule(marker_step) if marker_step is not None else chart


def replay_vs_target(df: pd.DataFrame) -> alt.LayerChart:
    """Share of replays per source bucket k (bars, one per run) against the target share from the run's
    bucket weights w(k/K) (black ticks), df: [run, k, replayed, share, target]."""
    runs = list(dict.fromkeys(df["run"]))
    base = alt.Chart(df).encode(x=alt.X("k:O", title="source bucket k (latest k when drawn for replay)",
                                      axis=alt.Axis(labelAngle=0)),
                                xOffset=alt.XOffset("run:N", sort=runs))
    bars = base.mark_bar(opacity=0.8).encode(
        y=alt.Y("share:Q", title="share of replays", axis=alt.Axis(format="%")),
        color=alt.Color("run:N", title=None, sort=runs, scale=alt.Scale(scheme="tableau10")),
        tooltip=["run:N", "k:O", "replayed:Q", alt.Tooltip("share:Q", format=".1%"), alt.Tooltip("target:Q", format=".1%")])
    ticks = base.mark_tick(color="black", thickness=2, size=18).encode(
        y="target:Q", tooltip=["run:N", "k:O", alt.Tooltip("target:Q", title="target share", format=".1%")])
    return (bars + ticks).properties(height=HEIGHT, title="replays per source bucket vs target weights (black)")


def group_history(df: pd.DataFrame, group_size: int) -> alt.Chart:
    """k per step of one question's groups, fresh and replayed groups marked apart."""
    d = df.assign(group=np.where(df["is_replay"], "mixed (replay)", "fresh"))
    return alt.Chart(d, title="k correct of K per group").mark_line(point=True).encode(
        x=alt.X("step:Q", axis=STEP_AXIS), y=alt.Y("k:Q", scale=alt.Scale(domain=[0, group_size])),
        color=alt.Color("group:N", title=None), tooltip=["step:Q", "k:Q", "n:Q", "group:N"],
    ).properties(height=200)
