"""The pre-registered grid's driver (benchmarks/learning/lr_grid.py): the reuse check and import, the
refusal to analyse before all planned seeds, and its report (benchmarks/learning/lr_grid_report.py)
on synthetic archives, without training."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from benchmarks.learning import lr_grid, lr_grid_report, seed_archive
from exgrpo_core.evaluation import tuned

START = "tiny-sft sha256:abc"


def _run(arm: str, seed: int, area: float) -> dict:
    curve = [0.3, area, area + 0.05]
    return {"row": {"arm": arm, "seed": seed, "heldout": {"arith-test": curve[-1]}, "heldout_avg": curve[-1],
                    "heldout_start": 0.3, "heldout_auc": area},
            "curves": {"heldout_step": [-1, 49, 99], "heldout_pass1": curve, "heldout_responses": [0.0, 3200.0, 6400.0]},
            "questions": {"last": {"q1": [1, 0, 1, 1]}}}


def _area(rate_index: int, arm: str, seed: int) -> float:
    top = 2 if arm == "on_policy" else 1  # on-policy is best at 1e-4, ExGRPO at 5.5e-5, 0.01 higher
    return 0.45 + (0.01 if arm == "exgrpo" else 0) - 0.03 * abs(rate_index - top) + 0.004 * ((seed * 7 + rate_index) % 3)


def _cells(seeds: list[int], arms=("on_policy", "exgrpo", "rho_0.25")) -> dict:
    return {x: {"name": lr_grid.cell_name(x), "fingerprint": lr_grid.fingerprint(x, START),
                "seeds": {str(s): {"commit": "c0ffee1", "results": [_run(a, s, _area(j, a, s)) for a in arms]}
                          for s in seeds}}
            for j, x in enumerate(lr_grid.RATES)}


def test_the_reuse_check_names_every_held_out_value_that_differs():
    a = _cells([0])["3e-5"]["seeds"]["0"]
    assert lr_grid.heldout_differences(a, copy.deepcopy(a)) == []
    b = copy.deepcopy(a)
    b["results"][1]["curves"]["heldout_pass1"][1] += 2 ** -10  # one evaluation, one sample in 1024
    b["results"][0]["questions"]["last"]["q1"][0] = 0
    assert lr_grid.heldout_differences(a, b) == ["on_policy: per-question results", "exgrpo: heldout_pass1"]
    b["results"] = b["results"][:1]
    assert "exgrpo: missing" in lr_grid.heldout_differences(a, b)


def test_a_source_is_imported_only_for_the_grid_arms_and_tagged():
    cell = {"seeds": {"0": {"results": []}}}
    source = {**_cells([0, 1, 2])["3e-5"], "name": "af-x"}
    assert lr_grid.import_source(cell, source, [0, 1, 2, 5]) == [1, 2]
    assert [r["row"]["arm"] for r in cell["seeds"]["1"]["results"]] == ["on_policy", "exgrpo"]
    assert cell["seeds"]["2"]["reused_from"] == "af-x" and cell["seeds"]["0"] == {"results": []}


def test_a_source_with_another_start_model_rate_or_override_is_refused():
    src = {"fingerprint": {"preset": "arith-fast", "arms": ["on_policy", "exgrpo"], "overrides": ["train.lr=0.00003"],
                           "start_model": START}}
    assert lr_grid.source_problems(src, "3e-5", START) == []
    assert lr_grid.source_problems(src, "1e-4", START) == ["its learning rate is not 1e-4"]
    assert "is not today's" in lr_grid.source_problems(src, "3e-5", "tiny-sft sha256:other")[0]
    src["fingerprint"]["overrides"].append("buffer.replay_ratio=0.25")
    assert "change more than the learning rate" in lr_grid.source_problems(src, "3e-5", START)[0]


def test_final_is_refused_before_every_planned_seed_is_in(tmp_path, monkeypatch, capsys):
    cells = _cells([0, 1, 2], arms=("on_policy", "exgrpo"))
    del cells["3.2e-4"]["seeds"]["2"]
    for c in cells.values():
        (tmp_path / f"arith_compare_{c['name']}_seeds.json").write_text(json.dumps(c))
    monkeypatch.setattr(lr_grid, "RESULTS", tmp_path)
    assert lr_grid.main(["--final", "--seeds", "0-2"]) == 2
    err = capsys.readouterr().err
    assert "2 of 3 planned seed blocks are complete" in err and "Traceback" not in err
    assert not (tmp_path / "lr_grid_prereg.md").exists()


def test_the_report_leads_with_the_pre_registered_verdict(tmp_path):
    seeds = list(range(6))
    cells = _cells(seeds, arms=("on_policy", "exgrpo"))
    cells["3e-5"]["reuse"] = {"source": "af-slow", "ok": True}
    rec = lr_grid_report.write(cells, lr_grid.RATES, lr_grid.ARMS, seeds, planned=24, stopped="time", out=tmp_path)
    m = lr_grid_report.matrices(cells, lr_grid.RATES, lr_grid.ARMS, seeds)
    expect = tuned.tuned_bootstrap(m["grids"]["exgrpo"]["area"], m["grids"]["on_policy"]["area"])
    got = rec["analysis"]["arms"]["exgrpo"]["primary"]
    assert (got["best_a"], got["best_b"]) == (1, 2) and got["diff"] == pytest.approx(expect["diff"])
    assert (got["lo"], got["hi"]) == pytest.approx((expect["lo"], expect["hi"]))
    md = (tmp_path / "lr_grid_prereg.md").read_text().splitlines()
    assert md[2].startswith(f"**Verdict: {got['verdict']}.** Tuned-per-arm area difference {got['diff']:+.4f}")
    assert "6 of 24 planned seeds; stopped early: time" in md[2] and "lr 3e-5 from af-slow: reused" in md[4]
    assert (tmp_path / "lr_grid_prereg_curves.png").read_bytes()[:4] == b"\x89PNG"
    curves = lr_grid_report.mean_curves(cells, lr_grid.RATES, lr_grid.ARMS, seeds)
    assert curves["exgrpo"]["1e-4"][0] == [0, 50, 100]
    assert curves["exgrpo"]["1e-4"][1][1] == pytest.approx(np.mean([_area(2, "exgrpo", s) for s in seeds]))
    json.dumps(lr_grid_report.finite(rec), allow_nan=False)  # strict JSON


def test_the_grid_runs_seed_major_checks_reuse_first_and_prints_only_seed_counts(tmp_path, monkeypatch, capsys):
    import flows.compare.flow as compare_flow
    import flows.prefect_api as prefect_api

    calls = []

    def fake_compare(preset, overrides, arms, seeds, name):
        calls.append((seeds[0], name))
        rate = lr_grid.RATES[[lr_grid.cell_name(x) for x in lr_grid.RATES].index(name)]
        assert f"train.lr={rate}" in overrides and arms == lr_grid.ARMS and preset == "arith-fast"
        runs = [_run(a, seeds[0], 0.4) for a in arms]
        doc = {"rows": [r["row"] for r in runs], "curves": {f"{a}/s{seeds[0]}": r["curves"] for a, r in zip(arms, runs)},
               "eval_questions": {f"{a}/s{seeds[0]}": r["questions"] for a, r in zip(arms, runs)}}
        path = tmp_path / f"{name}-{seeds[0]}.json"
        path.write_text(json.dumps(doc))
        return {"files": {"json": str(path)}}

    monkeypatch.setattr(lr_grid, "RESULTS", tmp_path)
    monkeypatch.setattr(lr_grid, "start_model", lambda preset, overrides: START)
    monkeypatch.setattr(lr_grid, "code_state", lambda: {"head": "abc1234"})
    monkeypatch.setattr(prefect_api, "serve_prefect_api", lambda: None)
    monkeypatch.setattr(compare_flow, "compare", fake_compare)
    source = {**_cells([0, 1], arms=("on_policy", "exgrpo"))["1e-4"], "name": "af-ablations-2"}
    source["fingerprint"] = {**source["fingerprint"], "overrides": []}  # the preset's own rate, 1e-4
    source["seeds"]["0"]["results"] = [_run(a, 0, 0.4) for a in ("on_policy", "exgrpo")]  # what the rerun gives
    (tmp_path / "arith_compare_af-ablations-2_seeds.json").write_text(json.dumps(source))
    assert lr_grid.run([0, 1], str(tmp_path / "runs"), 1) == 0
    cells = [lr_grid.cell_name(x) for x in lr_grid.RATES]
    # seed 0: the two reuse candidates first; lr 1e-4 reproduced, so its seed 1 is imported, not run
    assert calls == [(0, cells[0]), (0, cells[2]), (0, cells[1]), (0, cells[3]), (0, cells[4]),
                     (1, cells[0]), (1, cells[1]), (1, cells[3]), (1, cells[4])]
    lr1e4 = json.loads((tmp_path / f"arith_compare_{cells[2]}_seeds.json").read_text())
    assert lr1e4["reuse"]["ok"] and lr1e4["reuse"]["imported_seeds"] == [1]
    assert lr1e4["seeds"]["1"]["reused_from"] == "af-ablations-2" and lr1e4["seeds"]["0"]["code"] == {"head": "abc1234"}
    lr3e5 = json.loads((tmp_path / f"arith_compare_{cells[0]}_seeds.json").read_text())
    assert not lr3e5["reuse"]["ok"] and "no archive" in lr3e5["reuse"]["why"]
    out = capsys.readouterr().out
    assert "complete seed blocks: 2" in out and "area" not in out and "interval" not in out


def test_a_second_workers_seeds_merge_in_only_when_the_seeds_both_hold_agree(tmp_path, monkeypatch, capsys):
    here, worker = tmp_path / "here", tmp_path / "worker"
    here.mkdir()
    worker.mkdir()
    for folder, seeds in ((here, [0, 1, 2]), (worker, [2, 3])):
        for cell in _cells(seeds, arms=("on_policy", "exgrpo")).values():
            seed_archive.save({**cell, "path": str(folder / f"arith_compare_{cell['name']}_seeds.json")})
    monkeypatch.setattr(lr_grid, "RESULTS", here)
    bad = worker / f"arith_compare_{lr_grid.cell_name('1e-4')}_seeds.json"
    good = bad.read_text()
    doc = json.loads(good)
    doc["seeds"]["2"]["results"][1]["row"]["heldout_auc"] += 0.001  # seed 2 ran differently there
    bad.write_text(json.dumps(doc))
    before = {p.name: p.read_text() for p in here.iterdir()}
    assert lr_grid.main(["--merge-from", str(worker)]) == 2
    assert "lr 1e-4 seed 2: exgrpo: heldout_auc" in capsys.readouterr().err
    assert {p.name: p.read_text() for p in here.iterdir()} == before  # nothing written
    bad.write_text(good)
    assert lr_grid.main(["--merge-from", str(worker)]) == 0
    assert capsys.readouterr().out.count("merged seeds [3]") == len(lr_grid.RATES)
    for r in lr_grid.RATES:
        merged = json.loads((here / f"arith_compare_{lr_grid.cell_name(r)}_seeds.json").read_text())
        assert sorted(merged["seeds"], key=int) == ["0", "1", "2", "3"]
    assert lr_grid.main(["--merge-from", str(worker)]) == 0
    assert "merged seeds []" in capsys.readouterr().out
    assert lr_grid.main(["--merge-from", str(tmp_path / "nope")]) == 2
    assert "no such folder" in capsys.readouterr().err
