"""DAPO's filter: a group is dropped exactly when its rewards are all equal."""

from __future__ import annotations

import pytest

from exgrpo_core.algorithm import dynamic_sampling as ds


def test_all_equal_groups_are_dropped_and_spread_ones_kept():
    assert ds.uninformative([0, 0, 0]) and ds.uninformative([1.0, 1.0]) and ds.uninformative([0.4, 0.4])
    assert not ds.uninformative([0, 1, 1]) and not ds.uninformative([0.4, 0.41])
    assert ds.dropped({"a": [1, 1], "b": [0, 1], "c": [0, 0], "d": [0.2, 0.7]}) == ["a", "c"]
    with pytest.raises(ValueError):
        ds.uninformative([])
