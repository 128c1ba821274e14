"""benchmarks/learning/smollm2_lr.py reads the sweep runs' held-out curves from their databases and ranks them by AUC."""

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.learning import smollm2_lr  # noqa: E402

from exgrpo_core import metrics as M  # noqa: E402
from exgrpo_core.store.experience_store import ExperienceStore, resolve_db_url  # noqa: E402


def _run(root: Path, lr: str, heldout: dict[int, float]) -> None:
    run_dir = root / f"sm-lr-{lr}"
    run_dir.mkdir(parents=True)
    with ExperienceStore(resolve_db_url(None, run_dir)) as store:
        store.start_run("r-" + lr, run_dir.name, "smollm2-evidence", {}, 8)
        for step, v in heldout.items():
            store.save_eval("r-" + lr, step, "arith-half-test", {"pass@1": v}, 160)
        for step in range(max(heldout) + 1):
            store.log_metrics("r-" + lr, step, {M.REWARD_MEAN: 0.3})


def test_sweep_table_ranks_rates_by_area_over_the_shared_span(tmp_path, monkeypatch, capsys):
    _run(tmp_path, "2e-6", {-1: 0.3, 9: 0.4, 19: 0.5})
    _run(tmp_path, "1e-5", {-1: 0.3, 9: 0.6, 19: 0.4, 29: 0.9})  # its step 29 is past the shared span
    _run(tmp_path, "2e-5", {-1: 0.3})  # still at its first evaluation: shown, not ranked
    curve = smollm2_lr.run_curve(tmp_path / "sm-lr-1e-5")
    assert curve["heldout"] == [(-1, 0.3), (9, 0.6), (19, 0.4), (29, 0.9)] and curve["last_step"] == 29
    # steps 0, 10, 20: (10 * 0.35 + 10 * 0.45) / 20 = 0.4 and (10 * 0.45 + 10 * 0.5) / 20 = 0.475
    assert math.isclose(smollm2_lr.auc(smollm2_lr.run_curve(tmp_path / "sm-lr-2e-6")["heldout"], 19), 0.4)
    assert math.isclose(smollm2_lr.auc(curve["heldout"], 19), 0.475)
    results = tmp_path / "results"
    monkeypatch.setattr("benchmarks.bench_record.RESULTS", results)
    monkeypatch.setattr(sys, "argv", ["smollm2_lr.py", "--runs", str(tmp_path)])
    smollm2_lr.main()
    out = json.loads((results / "smollm2_lr_sweep.json").read_text())
    assert out["best_lr"] == "1e-5" and out["auc_upto_step"] == 19
    assert math.isnan(out["runs"]["2e-5"]["auc"])
    assert "best AUC: lr 1e-5" in capsys.readouterr().out
