"""A sweep over arms x learning rates x seeds reports the tuned-per-arm comparison first
(flows/compare/sweep.py + flows/compare/tuned_report.py), from children read back as the flow reads them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_compare import _child

from exgrpo_core.config.load import ConfigError
from exgrpo_core.evaluation import tuned
from exgrpo_core.store.experience_store import ExperienceStore
from flows.compare import parallel as par
from flows.compare.grid import build_children
from flows.compare.sweep import write_sweep_report

GRID = ["arm=on_policy,exgrpo", "train.lr=1e-5,1e-4,1e-3"]
# area[arm][rate][seed]: on-policy is best at 1e-4, ExGRPO at 1e-5; ExGRPO's best is 0.02 above.
AREA = {"arm=on_policy": [[0.30, 0.31, 0.29], [0.40, 0.42, 0.41], [0.10, 0.12, 0.08]],
        "arm=exgrpo": [[0.43, 0.42, 0.44], [0.39, 0.40, 0.41], [0.05, 0.06, 0.04]]}


def _results(tmp_path, grid=GRID, seeds="0-2", missing=()):
    tmp_path.mkdir(parents=True, exist_ok=True)
    db = tmp_path / "e.db"
    kids = build_children("tiny", [f"run.db_url=sqlite:///{db}", f"run.output_dir={tmp_path / 'runs'}"], grid, seeds,
                          "sw", evaluate=False)
    store = ExperienceStore(f"sqlite:///{db}")
    for k in kids:
        _child(store, [(8, 0, 0)], [0.5], name=k.name)
    store.close()
    results = []
    for k in kids:
        r = par.collect(k, "cancelled" if (k.label, k.seed) in missing else "finished")
        if r["row"]["status"] == "finished":
            *arm, rate = k.label.split()  # a grid without arms reads on-policy's values
            rates = next(g for g in grid if g.startswith("train.lr=")).split("=")[1].split(",")
            area = AREA[arm[0] if arm else "arm=on_policy"][rates.index(rate.split("=")[1])][k.seed]
            r["row"].update(heldout_auc=area, heldout_avg=area + 0.1, heldout_start=0.4)
        results.append(r)
    return results


def test_arm_is_a_grid_key_that_stands_for_the_arms_overrides():
    kids = build_children("tiny", ["run.steps=3"], GRID, "0", "sw", evaluate=False)
    assert [(k.label, k.cfg.buffer.replay_ratio, k.cfg.train.lr) for k in kids][:2] == [
        ("arm=on_policy train.lr=1e-5", 0.0, 1e-5), ("arm=on_policy train.lr=1e-4", 0.0, 1e-4)]
    assert kids[-1].cfg.buffer.replay_ratio > 0 and kids[-1].name == "sw-arm-exgrpo_train.lr-1e-3-s0"
    with pytest.raises(ConfigError, match="unknown comparison arm"):
        build_children("tiny", [], ["arm=on_policy,nope", "train.lr=1e-5,1e-4"], "0", "sw", evaluate=False)


def test_the_report_leads_with_each_arm_at_its_own_best_rate(tmp_path):
    paths = write_sweep_report(_results(tmp_path), tmp_path / "out", "sw",
                               {"title": "Sweep", "row_label": "grid point", "grid": GRID, "notes": ["Command: x"]})
    md = Path(paths["md"]).read_text()
    primary = md.index("## Primary: each arm at its own best learning rate")
    assert md.index("Command: x") < primary < md.index("| grid point | seed |")  # before the table
    assert "| arm=exgrpo - arm=on_policy | 1e-5 / 1e-4 | +0.0200 |" in md
    assert "Flag: 3 seeds" in md
    doc = json.loads(Path(paths["json"]).read_text())["tuned"]
    a, b = np.array(AREA["arm=exgrpo"]), np.array(AREA["arm=on_policy"])
    expect = tuned.tuned_bootstrap(a, b)  # the same numbers as the library's on the same grid
    got = doc["arms"]["arm=exgrpo"]["primary"]
    assert (got["diff"], got["lo"], got["hi"]) == pytest.approx((0.02, expect["lo"], expect["hi"]))
    assert got["verdict"] == tuned.verdict(expect["lo"], expect["hi"], 0.005)
    sec = doc["arms"]["arm=exgrpo"]["secondary"]
    assert sec["area at the baseline's best rate"]["diff"] == pytest.approx(0.40 - 0.41)
    assert sec["final at each arm's best rate"]["diff"] == pytest.approx(0.02)
    assert all(0 < v["p"] <= v["p_holm"] <= 1 for v in sec.values())
    assert "| area at the highest rate (1e-3) | -0.0500 |" in md  # 0.05 / 0.10 apart in every seed
    assert sec["area at the highest rate (1e-3)"]["p_holm"] < 0.05 and "| <0.001 | <0.001 | behind |" in md
    assert doc["cells"]["arm=on_policy"][1] == {"rate": "1e-4", "area": pytest.approx(0.41),
                                                "final": pytest.approx(0.51), "collapsed": 0}
    assert [doc["cells"][a][2]["collapsed"] for a in AREA] == [1, 3]  # finals below 0.5 x 0.4 at 1e-3


def test_seeds_missing_a_cell_are_left_out_and_named(tmp_path):
    results = _results(tmp_path, missing={("arm=exgrpo train.lr=1e-3", 2)})
    paths = write_sweep_report(results, tmp_path / "out", "sw",
                               {"title": "Sweep", "row_label": "grid point", "grid": GRID, "notes": ["Command: x"]})
    doc = json.loads(Path(paths["json"]).read_text())["tuned"]
    assert doc["seeds"] == [0, 1] and doc["dropped_seeds"] == [2]
    assert "left out, incomplete: [2]" in Path(paths["md"]).read_text()


def test_a_grid_without_arms_or_with_one_seed_has_no_tuned_section(tmp_path):
    meta = {"title": "Sweep", "row_label": "grid point", "grid": ["train.lr=1e-5,1e-4"], "notes": ["Command: x"]}
    paths = write_sweep_report(_results(tmp_path, grid=["train.lr=1e-5,1e-4"]), tmp_path / "a", "sw", meta)
    assert "Primary" not in Path(paths["md"]).read_text() and "tuned" not in json.loads(Path(paths["json"]).read_text())
    paths = write_sweep_report(_results(tmp_path / "b", seeds="0"), tmp_path / "b" / "out", "sw", {**meta, "grid": GRID})
    assert "Primary" not in Path(paths["md"]).read_text()
