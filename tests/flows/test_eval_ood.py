"""The paper's evaluation through the flows: `paper` preset = ID + OOD suites, ID / OOD averages in the logged
metrics, and `exgrpo evaluate --suite mmlu-pro` without the hub as one clear error line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from exgrpo_core import metrics as M
from exgrpo_core.config.load import load_config
from exgrpo_core.evaluation import evaluate as E, suites as S

ROOT = Path(__file__).resolve().parents[2]


def test_paper_preset_evaluates_the_id_and_the_ood_suites():
    from flows.eval_tasks import generation_args, load_items

    cfg = load_config("paper")
    assert cfg.eval.suites == ["paper-valid", "ood"]
    groups = Counter(S.group_of(it.benchmark) for it in load_items(cfg))
    assert groups == {S.ID: 1590, S.OOD: 1370}  # the six math benchmarks; ARC-c 1,172 + GPQA 198
    assert generation_args(cfg)["require_think"] is cfg.reward.require_think


def test_flat_metrics_log_the_id_and_ood_averages():
    from flows.eval_tasks import flat_metrics

    def qr(bench, c):
        return E.QuestionResult(uid=bench, benchmark=bench, answer="A", n=1, correct=c, reasons={},
                                response_tokens=1, truncated=0)

    report = E.score([qr("AIME24", 1), qr("MATH-500", 0), qr("ARC-c", 1), qr("GSM8K", 0)])
    flat = flat_metrics(report)
    assert flat["eval/id_average/pass_at_1"] == pytest.approx(0.5)
    assert flat["eval/ood_average/pass_at_1"] == pytest.approx(1.0)
    assert flat[M.eval_key("average", "pass@1")] == pytest.approx(0.5)  # all four benchmarks
    assert all(M.declared(k, 8) for k in flat)


@pytest.mark.slow
def test_cli_mmlu_pro_without_the_hub_is_one_clear_error(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "evaluate", "--config", "tiny", "--suite", "mmlu-pro"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    flat = " ".join(out.split())
    assert proc.returncode == 2 and "Traceback" not in out
    assert "error: suite mmlu-pro: cannot load TIGER-Lab/MMLU-Pro" in flat and "hub access" in flat
