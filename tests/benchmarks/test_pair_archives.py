"""benchmarks/learning/pair_archives.py: arms of two archives are paired only when the archives agree."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.learning import pair_archives  # noqa: E402

FP = {"preset": "arith-fast", "arms": ["on_policy", "x"], "overrides": ["train.lr=3e-05"], "start_model": "sha:1"}


def row(arm, seed, final, auc, start=0.3):
    return {"row": {"arm": arm, "seed": seed, "heldout_avg": final, "heldout_auc": auc, "heldout_start": start},
            "curves": {}, "questions": {}}


def write(folder, name, arm, values, base=None, fp=FP):
    seeds = {}
    for s, (final, auc) in values.items():
        b = (base or {}).get(s, (0.5 + s / 100, 0.4))
        seeds[str(s)] = {"commit": "abc", "date": "2026-11-27",
                         "results": [row("on_policy", s, *b), row(arm, s, final, auc)]}
    body = {"name": name, "fingerprint": {**fp, "arms": ["on_policy", arm]}, "seeds": seeds}
    (folder / f"arith_compare_{name}_seeds.json").write_text(json.dumps(body))


def test_differences_are_second_minus_first_on_shared_seeds(tmp_path, capsys):
    write(tmp_path, "a", "exgrpo", {0: (0.50, 0.40), 1: (0.60, 0.45), 2: (0.55, 0.42), 3: (0.9, 0.9)})
    write(tmp_path, "b", "uniform", {0: (0.52, 0.41), 1: (0.64, 0.44), 2: (0.58, 0.43)})
    rc = pair_archives.main(["a:exgrpo", "b:uniform", "--folder", str(tmp_path), "--no-save"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "3 paired seeds" in out and "| final held-out pass@1 |" in out
    a = pair_archives.seed_archive.load_existing("a", tmp_path)
    b = pair_archives.seed_archive.load_existing("b", tmp_path)
    res = pair_archives.pair(a, "exgrpo", b, "uniform")
    assert res["seeds"] == [0, 1, 2]  # seed 3 only in one archive
    final = res["metrics"]["heldout_avg"]
    assert final["per_seed"] == pytest.approx({0: 0.02, 1: 0.04, 2: 0.03})
    assert final["mean"] == pytest.approx(0.03) and final["ahead"] == 3 and final["verdict"] == "ahead"
    auc = res["metrics"]["heldout_auc"]
    assert auc["mean"] == pytest.approx(0.0033333, abs=1e-6) and (auc["ahead"], auc["behind"]) == (2, 1)


def test_a_baseline_that_did_not_repeat_is_refused(tmp_path, capsys):
    write(tmp_path, "a", "exgrpo", {0: (0.5, 0.4), 1: (0.6, 0.45)})
    write(tmp_path, "b", "uniform", {0: (0.5, 0.4), 1: (0.6, 0.45)}, base={1: (0.7, 0.4)})
    assert pair_archives.main(["a:exgrpo", "b:uniform", "--folder", str(tmp_path), "--no-save"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "seed 1: on_policy differs" in err and "heldout_avg" in err


@pytest.mark.parametrize("args, message", [
    (["a:exgrpo", "c:uniform"], "overrides differs"),
    (["a:nope", "b:uniform"], "has no arm 'nope'"),
    (["a", "b:uniform"], "expected NAME:ARM"),
    (["a:exgrpo", "zz:uniform"], "no archive arith_compare_zz_seeds.json"),
])
def test_bad_input_is_one_line(tmp_path, capsys, args, message):
    write(tmp_path, "a", "exgrpo", {0: (0.5, 0.4), 1: (0.6, 0.45)})
    write(tmp_path, "b", "uniform", {0: (0.5, 0.4), 1: (0.6, 0.45)})
    write(tmp_path, "c", "uniform", {0: (0.5, 0.4), 1: (0.6, 0.45)}, fp={**FP, "overrides": []})
    assert pair_archives.main([*args, "--folder", str(tmp_path), "--no-save"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err
