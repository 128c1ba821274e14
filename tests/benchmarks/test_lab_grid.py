"""The replay lab grid's driver (benchmarks/learning/lab_grid.py): its rates and order, the sealed compare
output (no endpoint reaches the terminal), the machine record per archived seed, the refusal to analyse
early, the merge check, and its report (lab_grid_report.py) on synthetic archives, without training."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from benchmarks.learning import lab_grid, lab_grid_report, lr_grid_report
from exgrpo_core.evaluation import tuned

START = "tiny-sft sha256:abc"


def _run(arm: str, seed: int, area: float) -> dict:
    curve = [0.25, area, area + 0.05]
    return {"row": {"arm": arm, "seed": seed, "heldout": {"arith3-test": curve[-1]}, "heldout_avg": curve[-1],
                    "heldout_start": 0.25, "heldout_auc": area},
            "curves": {"heldout_step": [-1, 74, 149], "heldout_pass1": curve, "heldout_responses": [0.0, 1.0, 2.0]},
            "questions": {"last": {"q1": [1, 0, 1, 1]}}}


def _area(j: int, arm: str, seed: int) -> float:
    top = {"on_policy": 1, "exgrpo": 0}.get(arm, 2)
    return 0.5 + (0.004 if arm == "exgrpo" else 0) - 0.02 * abs(j - top) + 0.003 * ((seed * (5 + len(arm)) + j) % 4)


def _cells(part: dict, seeds: list[int]) -> dict:
    return {x: {"name": lab_grid.cell_name(part, x), "fingerprint": lab_grid.fingerprint(part, x, START),
                "seeds": {str(s): {"commit": "c0ffee1", "results": [_run(a, s, _area(j, a, s)) for a in part["arms"]]}
                          for s in seeds}}
            for j, x in enumerate(lab_grid.RATES)}


def test_rates_are_r_star_over_and_times_one_and_a_half_and_the_order_is_part_then_seed_major():
    r = lab_grid.R_STAR
    assert [float(x) for x in lab_grid.RATES] == pytest.approx([r / 1.5, r, r * 1.5], rel=5e-3)
    order = lab_grid.plan(["primary", "exploratory"], None)
    assert len(order) == 3 * 20 + 3 * 8 and len(lab_grid.EXPLORATORY["arms"]) == 5
    assert [(p["prefix"], s) for p, s, _ in order[:4]] == [("lab3", 0)] * 3 + [("lab3", 1)]
    assert {p["prefix"] for p, _, _ in order[60:]} == {"lab3x"} and order[60][1] == 0
    assert [s for _, s, _ in lab_grid.plan(["primary"], [19, 3])] == [3, 3, 3, 19, 19, 19]


def test_sealed_output_goes_to_the_file_not_the_terminal(tmp_path):
    code = ("import sys; sys.path.insert(0, '.'); from benchmarks.learning.lab_grid import sealed; from pathlib import Path\n"
            "print('before', flush=True)\nwith sealed(Path(sys.argv[1])):\n"
            "    print('area 0.512'); import os; os.write(2, b'err line\\n')\nprint('after')")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "c.log")], capture_output=True, text=True,
                         cwd=lab_grid.ROOT, check=True)
    assert out.stdout.split() == ["before", "after"] and out.stderr == ""
    assert (tmp_path / "c.log").read_text().split("\n")[:2] == ["area 0.512", "err line"]


def test_the_grid_archives_code_and_machine_per_seed_and_prints_only_seed_counts(tmp_path, monkeypatch, capfd):
    import flows.compare.flow as compare_flow
    import flows.prefect_api as prefect_api

    calls = []

    def fake_compare(preset, overrides, arms, seeds, name):
        calls.append((seeds[0], name))
        os.write(1, b"| exgrpo | area 0.5123 |\n")  # the real flow's table, at the descriptor: sealed away
        runs = [_run(a, seeds[0], 0.4) for a in arms]
        doc = {"rows": [r["row"] for r in runs], "curves": {f"{a}/s{seeds[0]}": r["curves"] for a, r in zip(arms, runs)},
               "eval_questions": {f"{a}/s{seeds[0]}": r["questions"] for a, r in zip(arms, runs)}}
        path = tmp_path / f"{name}-{seeds[0]}.json"
        path.write_text(json.dumps(doc))
        assert preset == "arith3" and overrides[-1] in [f"train.lr={x}" for x in lab_grid.RATES]
        return {"files": {"json": str(path)}}

    monkeypatch.setattr(lab_grid, "RESULTS", tmp_path)
    monkeypatch.setattr(lab_grid, "LOG_DIR", tmp_path / "log")
    monkeypatch.setattr(lab_grid, "start_model", lambda preset, overrides: START)
    monkeypatch.setattr(lab_grid, "code_state", lambda: {"head": "abc1234"})
    monkeypatch.setattr(prefect_api, "serve_prefect_api", lambda: None)
    monkeypatch.setattr(compare_flow, "compare", fake_compare)
    monkeypatch.setitem(lab_grid.PRIMARY, "seeds", "0-1")
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    assert lab_grid.run(["primary"], None, str(tmp_path / "runs"), 1) == 0
    assert [s for s, _ in calls] == [0, 0, 0, 1, 1, 1]
    cell = json.loads((tmp_path / f"arith_compare_{lab_grid.cell_name(lab_grid.PRIMARY, lab_grid.RATES[1])}_seeds.json")
                      .read_text())
    entry = cell["seeds"]["1"]
    machine = cell["machines"][entry["machine"]]
    assert entry["code"] == {"head": "abc1234"} and machine["mkl_cbwr"] == "COMPATIBLE"
    assert "torch" in machine["torch_config"].lower() and machine["cpu_model"]
    out = capfd.readouterr().out
    assert "0.5123" not in out and "area" not in out and out.count("seeds archived per cell") == 7
    assert "0.5123" in (tmp_path / "log" / "compare.log").read_text()
    calls.clear()
    assert lab_grid.run(["primary"], None, str(tmp_path / "runs"), 1) == 0 and calls == []  # resumes: all archived
    monkeypatch.delenv("MKL_CBWR")
    assert lab_grid.run(["primary"], None, str(tmp_path / "runs"), 1) == 2 and calls == []
    assert "under another MKL_CBWR than this process's (unset)" in capfd.readouterr().err


def test_final_is_refused_before_every_planned_primary_seed_is_in(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(lab_grid, "RESULTS", tmp_path)
    for x, c in _cells(lab_grid.PRIMARY, list(range(19))).items():
        (tmp_path / f"arith_compare_{c['name']}_seeds.json").write_text(json.dumps(c))
    assert lab_grid.main(["--final"]) == 2
    assert "19 of 20 planned seed blocks are complete" in capsys.readouterr().err


def test_the_report_leads_with_the_verdict_and_adds_t_wilcoxon_cells_and_exploratory_arms(tmp_path):
    seeds = list(range(10))
    primary, explore = _cells(lab_grid.PRIMARY, seeds), _cells(lab_grid.EXPLORATORY, seeds[:8])
    rec = lab_grid_report.write(primary, explore, lab_grid.RATES, lab_grid.PRIMARY["arms"], lab_grid.EXPLORATORY["arms"],
                                seeds, planned=20, stopped="time", out=tmp_path)
    m = lr_grid_report.matrices(primary, lab_grid.RATES, lab_grid.PRIMARY["arms"], seeds)
    a, b = m["grids"]["exgrpo"]["area"], m["grids"]["on_policy"]["area"]
    expect = tuned.tuned_bootstrap(a, b)
    got = rec["analysis"]["arms"]["exgrpo"]["primary"]
    assert (got["best_a"], got["best_b"]) == (0, 1) and (got["lo"], got["hi"]) == pytest.approx((expect["lo"], expect["hi"]))
    t = rec["tuned_tests"]["exgrpo"]
    assert t["mean"] == pytest.approx((a[0] - b[1]).mean()) and t["n"] == 10 and 0 <= t["wilcoxon_p"] <= 1
    assert t["ahead"] + t["behind"] <= 10 and t["t_lo"] < t["mean"] < t["t_hi"]
    cell = rec["cells"]["on_policy"][1]
    assert cell["mean"] == pytest.approx(b[1].mean()) and cell["boot_lo"] <= cell["mean"] <= cell["boot_hi"]
    ex = rec["exploratory"]["max_age_8 - exgrpo"]
    assert ex["seeds"] == list(range(8)) and len(ex["shared"]) == 3
    md = (tmp_path / "lab_grid_prereg.md").read_text()
    assert md.splitlines()[2].startswith(f"**Verdict: {got['verdict']}.**") and "10 of 20 planned seeds" in md
    assert "Wilcoxon" in md and "## Exploratory arms (no verdict" in md and "| prompt_replay - on_policy (8 seeds) |" in md
    json.dumps(rec, allow_nan=False)


def test_a_second_workers_seeds_merge_only_when_shared_seeds_agree(tmp_path, monkeypatch, capsys):
    here, worker = tmp_path / "here", tmp_path / "worker"
    here.mkdir(), worker.mkdir()
    monkeypatch.setattr(lab_grid, "RESULTS", here)
    for folder, seeds in ((here, [0, 1]), (worker, [1, 2])):
        for c in _cells(lab_grid.PRIMARY, seeds).values():
            c["machines"] = {f"m-{folder.name}": {"cpu_model": folder.name}}
            (folder / f"arith_compare_{c['name']}_seeds.json").write_text(json.dumps(c))
    bad = worker / f"arith_compare_{lab_grid.cell_name(lab_grid.PRIMARY, lab_grid.RATES[0])}_seeds.json"
    good = bad.read_text()
    doc = json.loads(good)
    doc["seeds"]["1"]["results"][1]["curves"]["heldout_pass1"][1] += 0.01
    bad.write_text(json.dumps(doc))
    assert lab_grid.main(["--merge-from", str(worker)]) == 2 and "seed 1: exgrpo: heldout_pass1" in capsys.readouterr().err
    bad.write_text(good)
    assert lab_grid.main(["--merge-from", str(worker)]) == 0
    merged = json.loads((here / bad.name).read_text())
    assert sorted(merged["seeds"], key=int) == ["0", "1", "2"] and set(merged["machines"]) == {"m-here", "m-worker"}


def test_nothing_trains_while_the_plan_is_a_draft(monkeypatch, capsys):
    monkeypatch.setattr(lab_grid, "run", lambda *a: pytest.fail("trained under a draft plan"))
    monkeypatch.setattr(lab_grid, "REGISTERED", False)
    assert lab_grid.main(["--part", "primary"]) == 2
    assert "is a draft: no variant has passed the pilot gate" in capsys.readouterr().err
