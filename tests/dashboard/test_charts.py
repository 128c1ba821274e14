"""dashboard/charts.py: display bins keep every trajectory, densities integrate to one, stats are exact."""

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
            rows.append((group, int(b), len(x), x.sum(), (x * x).sum()))
    return pd.DataFrame(rows, columns=["group", "bin", "n", "sum", "sumsq"])


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


def test_empty_histogram_gives_empty_bins():
    assert charts.merge_bins(pd.DataFrame(columns=["group", "bin", "n", "sum", "sumsq"])).empty
