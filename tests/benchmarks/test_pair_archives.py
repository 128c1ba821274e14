"""benchmarks/learning/pair_archives.py: arms of two archives are paired only when the archives agree."""

import json
import sys
from pathlib import Path

import pytest
import scipy.stats

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


def _holm_by_hand(ps):
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    out, running = [0.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
        out[i] = running
    return out


def test_a_holm_family_spans_archives(tmp_path, capsys):
    write(tmp_path, "a", "exgrpo", {0: (0.52, 0.41), 1: (0.64, 0.47), 2: (0.58, 0.43)})
    write(tmp_path, "b", "uniform", {0: (0.49, 0.40), 1: (0.61, 0.45), 2: (0.57, 0.42), 3: (0.55, 0.39)},
          fp={**FP, "overrides": []})  # another setting: a family need not share settings
    assert pair_archives.main(["--family", "a,b", "--folder", str(tmp_path), "--no-save"]) == 0
    out = capsys.readouterr().out
    assert "Holm family: 4 tests" in out and "p Holm (family)" in out
    base = {s: (0.5 + s / 100, 0.4) for s in range(4)}  # on_policy in write()
    diffs = {("a", "heldout_avg"): [0.52 - 0.50, 0.64 - 0.51, 0.58 - 0.52],
             ("a", "heldout_auc"): [0.01, 0.07, 0.03],
             ("b", "heldout_avg"): [0.49 - 0.50, 0.61 - 0.51, 0.57 - 0.52, 0.55 - 0.53],
             ("b", "heldout_auc"): [0.0, 0.05, 0.02, -0.01]}
    assert base[2][0] == 0.52
    keys = list(diffs)
    raw = [scipy.stats.ttest_1samp(diffs[k], 0.0).pvalue for k in keys]
    tables = pair_archives.family(["a", "b"], tmp_path)
    arm = {"a": "exgrpo", "b": "uniform"}
    got = [tables[n][arm[n]][m]["p_holm_family"] for n, m in keys]
    assert got == pytest.approx(_holm_by_hand(raw))
    assert all(tables[n][arm[n]][m]["family_size"] == 4 for n, m in keys)


@pytest.mark.parametrize("args, message", [
    (["--family", "a,zz"], "no archive arith_compare_zz_seeds.json"),
    (["--family", "a,a"], "names an archive twice"),
    ([], "give two sides NAME:ARM NAME:ARM, or --family"),
    (["a:exgrpo"], "give two sides"),
])
def test_bad_family_input_is_one_line(tmp_path, capsys, args, message):
    write(tmp_path, "a", "exgrpo", {0: (0.5, 0.4), 1: (0.6, 0.45)})
    assert pair_archives.main([*args, "--folder", str(tmp_path), "--no-save"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err
