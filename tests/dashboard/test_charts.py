"""dashboard/charts.py: display bins keep every trajectory, densities integrate to one, stats are exact,
and each violin is drawn exactly over its group's entropy range (runs side by side)."""

import numpy as np
import pandas as pd
import pytest

from dashboard import charts
from dashboard.queries import BIN_WIDTH


def _sql_bins(values: dict[str, np.ndarray]) -> pd.DataFrame:
    """What queries.entropy_histogram returns, computed here in numpy."""
    rows = []
    for group, v in values.items():
        bins = (v / BIN_WIDTH).astype(int)
        for b in np.unique(bins):
            x = v[bins == b]
            rows.append((group, int(b), len(x), x.sum(), (x * x).sum(), x.min(), x.max()))
    return pd.DataFrame(rows, columns=["group", "bin", "n", "sum", "sumsq", "lo", "hi"])


def test_merged_bins_keep_counts_and_integrate_to_one():
    rng = np.random.default_rng(0)
    values = {"correct": rng.gamma(2, 0.5, 500), "incorrect": rng.gamma(4, 0.6, 300)}
    merged = charts.merge_bins(_sql_bins(values), max_bins=40)
    assert merged.groupby("group")["n"].sum().to_dict() == {"correct": 500, "incorrect": 300}
    width = merged["end"] - merged["start"]
    assert merged.assign(a=merged.density * width).groupby("group")["a"].sum().tolist() == pytest.approx([1, 1])
    assert merged.groupby("group").size().max() <= 40
    for group, v in values.items():  # every value falls in a display bin of its group
        g = merged[merged.group == group]
        assert all(((g.start <= x + 1e-9) & (x < g.end + 1e-9)).any() for x in v[:50])


def test_group_stats_equal_numpy():
    rng = np.random.default_rng(1)
    values = {"fresh": rng.uniform(0, 3, 200), "replayed": rng.uniform(0, 1, 20)}
    stats = charts.group_stats(_sql_bins(values)).set_index("group")
    for group, v in values.items():
        assert stats.loc[group, "trajectories"] == len(v)
        assert stats.loc[group, "mean entropy"] == pytest.approx(v.mean())
        assert stats.loc[group, "std"] == pytest.approx(v.std(), rel=1e-6)
        assert (stats.loc[group, "min"], stats.loc[group, "max"]) == (v.min(), v.max())


def test_empty_histogram_gives_empty_bins():
    assert charts.merge_bins(pd.DataFrame(columns=["group", "bin", "n", "sum", "sumsq", "lo", "hi"])).empty


# the case: a bucket at 0.012 +/- 0.009 nats beside buckets spread to 3.07, and one with a gap
RNG = np.random.default_rng(2)
BUCKETS = {"0": RNG.uniform(0, 3.07, 400), "4": np.r_[RNG.uniform(0.40, 0.44, 50), RNG.uniform(2.9, 2.94, 50)],
           "8": np.abs(RNG.normal(0.012, 0.009, 60)), "6": np.full(7, 1.9192)}


def _chart_rows(chart) -> pd.DataFrame:
    spec = chart.to_dict()
    return pd.DataFrame(next(iter(spec["datasets"].values())))


def test_each_violin_spans_exactly_its_groups_min_to_max():
    bins = charts.merge_bins(_sql_bins(BUCKETS))
    shapes = charts.violin_shapes(bins)
    for group, v in BUCKETS.items():
        g = shapes[shapes.group == group]
        assert g["y0"].min() == pytest.approx(v.min()) and g["y1"].max() == pytest.approx(v.max())
        assert g["n"].sum() == len(v)
        assert (g["x1"] - g["x0"]).max() == pytest.approx(2 * charts.VIOLIN_HALF_WIDTH)  # widest bin full width
        for y0, y1 in zip(g["y0"], g["y1"]):  # every band holds some of the group's values
            assert ((v >= y0 - 1e-9) & (v <= y1 + 1e-9)).any(), (group, y0, y1)
    gap = shapes[shapes.group == "4"]
    assert not ((gap["y1"] > 0.6) & (gap["y0"] < 2.8)).any()  # nothing drawn where bucket 4 has no trajectory


def test_violin_chart_data_are_the_querys_bins_and_means():
    hist = _sql_bins(BUCKETS)
    stats = charts.group_stats(hist)
    rows = _chart_rows(charts.violins(charts.merge_bins(hist), stats, "t", "bucket"))
    bands, means = rows[rows["mark"] == "bin"], rows[rows["mark"] == "mean"].set_index("group")
    assert bands.groupby("group")["n"].sum().to_dict() == {g: len(v) for g, v in BUCKETS.items()}
    for group, v in BUCKETS.items():
        assert bands.loc[bands.group == group, "y0"].min() >= v.min() - 1e-9
        assert bands.loc[bands.group == group, "y1"].max() <= v.max() + 1e-9
        assert means.loc[group, "y0"] == pytest.approx(v.mean())
        assert set(bands.loc[bands.group == group, "what"]) == {f"violin {group}"}


def test_violins_of_two_runs_sit_side_by_side():
    hist = pd.concat([_sql_bins(BUCKETS).assign(run="exgrpo"),
                      _sql_bins({"0": RNG.uniform(1, 2, 80)}).assign(run="on-policy")], ignore_index=True)
    shapes = charts.violin_shapes(charts.merge_bins(hist))
    for slot, run in enumerate(["exgrpo", "on-policy"]):
        mine = shapes[shapes.run == run]
        assert (mine["x0"] >= slot - charts.VIOLIN_HALF_WIDTH - 1e-9).all()
        assert (mine["x1"] <= slot + charts.VIOLIN_HALF_WIDTH + 1e-9).all()
    theirs = shapes[(shapes.run == "on-policy")]
    assert theirs["y0"].min() >= 1 and theirs["y1"].max() <= 2
    stats = charts.group_stats(hist)
    assert set(zip(stats.run, stats.group)) == {("exgrpo", g) for g in BUCKETS} | {("on-policy", "0")}
    rows = _chart_rows(charts.violins(charts.merge_bins(hist), stats, "t", "bucket"))
    assert "violin 0 | on-policy" in set(rows["what"])


def test_a_runs_colour_is_the_same_in_every_panel_and_legends_show_whole_names():
    long = "tiny-a-very-long-flow-run-name-of-forty-chars"  # longer than Vega's default 160 px label limit
    runs = ["exgrpo", long]
    both = _sql_bins({"1": RNG.uniform(1, 2, 50)}).assign(run="exgrpo")
    only_long = _sql_bins({"2": RNG.uniform(1, 2, 50)}).assign(run=long)  # a panel without `exgrpo`
    for part in (both, only_long):
        enc = charts.histogram(charts.merge_bins(part), "panel", color="run", domain=runs).to_dict()["encoding"]
        assert enc["color"]["scale"]["domain"] == runs  # the long name is colour 2 in both panels
        assert enc["color"]["legend"]["labelLimit"] >= 400
    curves = pd.DataFrame({"step": [0, 1, 0, 1], "value": [1.0, 2.0, 1.5, 2.5],
                           "run": [long, long, "exgrpo", "exgrpo"]})
    enc = charts.lines(curves, "value", "run", "t", domain=runs).to_dict()["encoding"]
    assert enc["color"]["scale"]["domain"] == runs and enc["color"]["legend"]["labelLimit"] >= 400
