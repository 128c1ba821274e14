"""The per-seed archive of benchmarks/learning/arith_compare.py: seeds add up across sessions, settings must match."""

import json
import math
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH.parent))
from benchmarks.learning import seed_archive  # noqa: E402

from flows.compare import report as compare_report, stats as compare_stats  # noqa: E402

REPORT = BENCH / "results" / "arith_compare_af-main_report.json"
FP = {"preset": "arith-fast", "arms": ["on_policy", "exgrpo"], "overrides": []}


def test_a_committed_report_round_trips_through_the_archive(tmp_path):
    report = json.loads(REPORT.read_text())
    archive = seed_archive.load("t", FP, tmp_path)
    added = seed_archive.import_report(archive, REPORT, "abc1234")
    seeds = sorted({r["seed"] for r in report["rows"] if r["seed"] != "mean"})
    assert added == seeds and len(seeds) >= 2
    seed_archive.save(archive)
    again = seed_archive.load("t", FP, tmp_path)  # read back from disk
    assert sorted(again["seeds"], key=int) == [str(s) for s in seeds]
    assert seed_archive.import_report(again, REPORT, "abc1234") == []  # nothing twice
    results = seed_archive.results(again)
    assert len(results) == 2 * len(seeds) and all(r["row"]["bucket_occupancy"] for r in results)
    paired = compare_stats.paired_stats([r["row"] for r in results])
    want = report["stats"]["paired_vs_on_policy"]["exgrpo"]["heldout_avg"]
    assert paired["exgrpo"]["heldout_avg"]["mean"] == pytest.approx(want["mean"])
    assert paired["exgrpo"]["heldout_avg"]["n"] == len(seeds)
    paths = compare_report.write_report(results, tmp_path / "out", "t", {"notes": []})
    md = Path(paths["md"]).read_text()
    assert "mean questions in bucket" in md and "| exgrpo | final held-out pass@1 |" in md


def test_other_settings_under_the_same_name_are_refused(tmp_path):
    archive = seed_archive.load("t", FP, tmp_path)
    seed_archive.save(archive)
    with pytest.raises(seed_archive.ArchiveError, match="use another --name"):
        seed_archive.load("t", {**FP, "overrides": ["train.lr=0.001"]}, tmp_path)


def test_a_seed_missing_an_arm_is_not_archived(tmp_path):
    report = json.loads(REPORT.read_text())
    report["rows"] = [r for r in report["rows"] if r["arm"] != "exgrpo"]
    archive = seed_archive.load("t", FP, tmp_path)
    with pytest.raises(seed_archive.ArchiveError, match="exgrpo"):
        seed_archive.add_seed(archive, 0, report, "abc")
    assert archive["seeds"] == {}


def test_nulls_become_nan_again():
    assert math.isnan(seed_archive._nan({"a": [None]})["a"][0])


def test_a_second_workers_archive_merges_in_and_other_settings_do_not(tmp_path):
    main = seed_archive.load("main", FP, tmp_path)
    seed_archive.import_report(main, REPORT, "abc")
    first = sorted(main["seeds"], key=int)[0]
    worker = {**seed_archive.load("w2", FP, tmp_path), "seeds": {}}
    for s in sorted(main["seeds"], key=int)[1:]:
        worker["seeds"][s] = main["seeds"].pop(s)
    seed_archive.save(main)
    seed_archive.save(worker)
    main = seed_archive.load("main", FP, tmp_path)
    added = seed_archive.merge(main, "w2")
    assert added and str(first) not in [str(s) for s in added] and sorted(main["seeds"], key=int)[0] == first
    assert seed_archive.merge(main, "w2") == []  # nothing twice
    seed_archive.save({**seed_archive.load("odd", {**FP, "overrides": ["train.lr=1"]}, tmp_path)})
    with pytest.raises(seed_archive.ArchiveError, match="use another --name"):
        seed_archive.merge(main, "odd")
    with pytest.raises(seed_archive.ArchiveError, match="no archive named 'nope'"):
        seed_archive.merge(main, "nope")


def test_an_archive_is_read_back_as_made_for_republishing(tmp_path):
    with pytest.raises(seed_archive.ArchiveError, match="no archive arith_compare_none_seeds.json"):
        seed_archive.load_existing("none", tmp_path)
    archive = seed_archive.load("t", FP, tmp_path)
    seed_archive.import_report(archive, REPORT, "abc1234")
    seed_archive.save(archive)
    with pytest.raises(seed_archive.ArchiveError):  # other settings: refused for new seeds ...
        seed_archive.load("t", {**FP, "overrides": ["train.lr=1"]}, tmp_path)
    again = seed_archive.load_existing("t", tmp_path)  # ... but its report can be rebuilt as it was made
    assert again["fingerprint"] == FP and sorted(again["seeds"]) == sorted(archive["seeds"])
    assert seed_archive.results(again) == seed_archive.results(archive)
