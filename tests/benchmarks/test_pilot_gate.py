"""The pilot gate counts the medium buckets and the replays drawn from them over its step window only."""

from __future__ import annotations

from benchmarks.learning.pilot_gate import gate
from exgrpo_core.algorithm.selection import bucket_weights


def test_the_gate_reads_the_window_and_the_bucket_before_each_replay():
    weights = bucket_weights(8, "gaussian", 1.0, "count")
    buckets = {3: [(0, 100.0), (1, 9.0), (2, 9.0)], 4: [(1, 8.0), (2, 10.0)], 5: [(1, 8.0), (2, 8.0)]}
    history = [(0, 1, 4, False), (0, 2, 1, False),  # step 1 (outside the window) sets the buckets
               (1, 1, 6, True), (1, 2, 2, True),    # step 2: replays from k=4 and k=1
               (2, 1, 5, True), (2, 2, 3, False)]   # step 3: a replay from k=6
    out = gate(buckets, history, 2, 3, weights)
    assert out["mean_questions"] == {3: 9.0, 4: 9.0, 5: 8.0}  # step 1's 100 is outside the window
    assert out["replays_by_bucket"] == {1: 1, 4: 1, 6: 1} and out["medium_share"] == 1 / 3
    assert not out["passes"] and round(out["target_share"], 3) == round(
        sum(weights[k] for k in (3, 4, 5)) / sum(weights.values()), 3)
    history += [(3, 1, 4, True), (3, 2, 4, True), (3, 3, 4, True)]
    assert gate(buckets, history, 2, 4, weights)["medium_share"] == 3 / 5  # q3 was never seen before: no bucket
    assert gate(buckets, history[:2] + [(1, 1, 4, True)], 2, 3, weights)["passes"]
