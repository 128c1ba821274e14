"""The comparison report's staleness section: replay ages and importance weights of each arm's runs."""

from __future__ import annotations

import math
from pathlib import Path

from test_compare import _child

from exgrpo_core import metrics as M
from exgrpo_core.store.experience_store import ExperienceStore
from flows.compare import report


def test_staleness_section_summarises_the_steps_that_replayed(tmp_path):
    store = ExperienceStore(f"sqlite:///{tmp_path / 'e.db'}")
    on = _child(store, [(8, 0, 0)] * 3, [0.1, 0.2, 0.3])
    ex = _child(store, [(8, 0, 0), (4, 4, 4), (5, 3, 2)], [0.1, 0.3, 0.5])
    stale = {0: (0, 0, 0, 0, 0), 1: (1.0, 1, 0.9, 1.5, 0.88), 2: (2.5, 4, 1.1, 7.0, 0.92)}  # step 0 replayed nothing
    for step, (age, age_max, w50, w_max, fw50) in stale.items():
        store.log_metrics(ex, step, {M.REPLAY_AGE_MEAN: age, M.REPLAY_AGE_MAX: age_max, M.REPLAY_W_P50: w50,
                                     M.REPLAY_W_P90: w50 * 2, M.REPLAY_W_MAX: w_max, M.REPLAY_FW_P50: fw50})
    results = [report.arm_result(store, on, "on_policy", 0, 64, None), report.arm_result(store, ex, "exgrpo", 0, 64, None)]
    ro, rx = results[0]["row"], results[1]["row"]
    assert all(math.isnan(ro[f]) for _, f, _ in report.STALENESS)  # on-policy never replayed
    assert rx["age_mean"] == (4 * 1.0 + 2 * 2.5) / 6  # weighted by the 4 and 2 replayed trajectories
    assert (rx["age_max"], rx["w_max"]) == (4, 7.0) and math.isclose(rx["w_p50"], 1.0)
    assert math.isclose(rx["w_p90"], 2.0) and math.isclose(rx["fw_p50"], 0.9)

    md = Path(report.write_report(results, tmp_path / "out", "s", {})["md"]).read_text()
    section = md.split("## Staleness of replayed trajectories", 1)[1]
    assert "| exgrpo | 0 | 1.500 | 4 | 1.000 | 2.000 | 7.000 | 0.900 |" in section
    assert "on_policy" not in section
    store.close()
