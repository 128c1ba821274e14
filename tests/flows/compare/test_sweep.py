"""Sweep grids (flows/compare/grid.py), the parallel options' user errors, and the table of parallel children
with failed or cancelled ones (flows/compare/parallel.py + flows/compare/report.py), without a Prefect server.
The children's submission and waiting run in tests/flows/compare/test_parallel_e2e.py."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from test_compare import _child

from exgrpo_core.config.load import ConfigError
from exgrpo_core.store.experience_store import ExperienceStore
from flows import cli
from flows.compare import parallel as par, report
from flows.compare.grid import build_children, grid_points, parse_grid, point_slug


def test_grid_points_are_every_combination_with_stable_names_and_seeds():
    kids = build_children("tiny", ["run.steps=3"], ["train.lr=1e-6,3e-6", "buffer.replay_ratio=0,0.5"], "0-1",
                          "sw", evaluate=False)
    assert [(k.label, k.seed) for k in kids][:3] == [("train.lr=1e-6 buffer.replay_ratio=0", 0),
                                                     ("train.lr=1e-6 buffer.replay_ratio=0", 1),
                                                     ("train.lr=1e-6 buffer.replay_ratio=0.5", 0)]
    assert len(kids) == 8 and len({k.name for k in kids}) == 8
    last = kids[-1]
    assert last.name == "sw-train.lr-3e-6_buffer.replay-ratio-0.5-s1" and last.cfg.run.seed == 1
    assert (last.cfg.train.lr, last.cfg.buffer.replay_ratio, last.cfg.run.steps) == (3e-6, 0.5, 3)
    assert last.overrides[-2:] == [f"run.name={last.name}", "run.seed=1"]  # the deployment's parameters
    assert [k.name for k in build_children("tiny", ["run.steps=3"], ["train.lr=1e-6,3e-6",
            "buffer.replay_ratio=0,0.5"], "0-1", "sw", evaluate=False)] == [k.name for k in kids]  # a rerun finds them
    assert grid_points(parse_grid(["a.b=1,2", "c=x"])) == [["a.b=1", "c=x"], ["a.b=2", "c=x"]]
    assert point_slug(["eval.suites=[bundled:x]"]) == "eval.suites-bundled-x"


@pytest.mark.parametrize("grid, message", [
    ([], "at least one --grid"), (["train.lr"], "expected KEY=V1,V2"), (["train.lr="], "expected KEY=V1,V2"),
    (["train.lr=1,1"], "values repeat"), (["train.lr=1", "train.lr=2"], "keys repeat"),
    (["train.lr=fast"], "train.lr"), (["nope.x=1"], "unknown key"), (["run.name=a b,a-b"], "same run names")])
def test_bad_grids_are_one_clear_error(grid, message):
    with pytest.raises(ConfigError, match=message):
        build_children("tiny", [], grid, "0", "sw", evaluate=False)


@pytest.mark.parametrize("argv, message", [
    (["compare", "--config", "tiny", "--parallel"], "set PREFECT_API_URL"),
    (["sweep", "--config", "tiny", "--grid", "train.lr=1e-6"], "set PREFECT_API_URL"),
    (["compare", "--config", "tiny", "--slots", "2"], "--slots only apply with --parallel"),
    (["compare", "--config", "tiny", "--retry-failed", "--pool", "p"], "--pool, --retry-failed only apply"),
    (["sweep", "--config", "tiny", "--grid", "train.lr=1e-6", "--slots", "0"], "--slots must be at least 1"),
    (["sweep", "--config", "tiny", "--grid", "train.lr=x"], "train.lr"),
    (["sweep", "--config", "tiny", "--grid", "train.lr=1e-6", "--seeds", "3-1"], "distinct integers")])
def test_cli_parallel_user_errors_exit_2_with_one_line(argv, message, monkeypatch, capsys):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    if "--slots" in argv and "0" in argv:
        monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    assert cli.main(argv) == 2
    out = capsys.readouterr().out
    assert out.startswith("error:") and message in " ".join(out.split()) and "Traceback" not in out


def test_the_table_marks_children_that_did_not_finish_and_leaves_them_out_of_the_means(tmp_path):
    db = tmp_path / "e.db"
    kids = build_children("tiny", [f"run.db_url=sqlite:///{db}", f"run.output_dir={tmp_path / 'runs'}"],
                          ["train.lr=0.1,0.2"], "0,1", "sw", evaluate=False)
    store = ExperienceStore(f"sqlite:///{db}")
    for k, w in zip(kids, (0.2, 0.6, 0.5)):  # the last child never ran
        _child(store, [(8, 0, 0)], [w], name=k.name)
    store.close()
    results = [par.collect(k, s) for k, s in zip(kids, ("finished", "finished", "failed", "cancelled"))]
    assert [r["row"]["status"] for r in results] == ["finished", "finished", "failed", "cancelled"]
    assert results[0]["row"]["final_reward"] == 0.2 and results[0]["row"]["run_id"]
    meta = {"title": "Sweep", "row_label": "grid point", "skip_columns": ["slots_to_target", "paper_id_avg"],
            "notes": [par.note(results, par.Target("d", queue="q"), "sweep")]}
    paths = report.write_report(results, tmp_path / "out", "sw", meta, prefix="sweep")
    md = Path(paths["md"]).read_text()
    assert Path(paths["md"]).name == "sweep_sw.md" and md.startswith("# Sweep `sw`")
    assert "| grid point | seed | status | final reward |" in md and "paper ID avg" not in md
    assert "on_policy" not in md  # no paired statistics without an on_policy arm
    assert "| train.lr=0.1 | mean | — | 0.400 |" in md  # over the two finished seeds
    assert "| train.lr=0.2 | 1 | cancelled | — | — |" in md and "| train.lr=0.2 | 0 | failed | — |" in md
    assert "train.lr=0.2 | mean" not in md  # no finished seed: no mean row
    assert Path(paths["png_reward"]).read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(par.ChildrenFailedError, match=r"2 of 4 children did not finish \(train.lr=0.2/s0 failed, "
                       r"train.lr=0.2/s1 cancelled\).*--retry-failed"):
        par.check_finished(results, paths["md"])
    par.check_finished(results[:2], paths["md"])
    assert math.isnan(par.placeholder(kids[3], "crashed")["row"]["heldout_avg"])
