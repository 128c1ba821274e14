"""Evaluation tables like the paper's Table 1 (rows = runs; columns = benchmarks, ID Avg, OOD Avg, Avg.)."""

from __future__ import annotations

import csv
import json

from exgrpo_core.evaluation import report as R
from exgrpo_core import metrics as M

SUMMARIES = {
    "GRPO": {"MATH-500": {"pass@1": 0.5, "samples": 1.0}, "AIME24": {"pass@1": 0.125, "samples": 32.0},
             "average": {"pass@1": 0.3125}},
    "ExGRPO": {"AIME24": {"pass@1": 0.25, "samples": 32.0}, "GSM8K": {"pass@1": 0.9, "samples": 1.0},
               "average": {"pass@1": 0.575}},
}


def test_table_puts_paper_benchmarks_first_in_percent_with_avg_at_k_in_the_header():
    header, rows = R.results_table(SUMMARIES)
    assert header == ["run", "AIME24 (avg@32)", "MATH-500", "ID Avg", "GSM8K", "Avg."]
    # GRPO's ID Avg: (12.5 + 50.0) / 2 = 31.25; ExGRPO has one ID benchmark; GSM8K is in no group
    assert rows == [["GRPO", 12.5, 50.0, 31.2, None, 31.2], ["ExGRPO", 25.0, None, 25.0, 90.0, 57.5]]
    md = R.to_markdown(header, rows)
    assert md.splitlines()[0] == "| run | AIME24 (avg@32) | MATH-500 | ID Avg | GSM8K | Avg. |"
    assert "| ExGRPO | 25.0 | - | 25.0 | 90.0 | 57.5 |" in md


def test_table_1_layout_id_benchmarks_id_avg_then_ood_benchmarks_ood_avg():
    """Columns in the paper's order whatever order the runs list them in; averages unweighted per group."""
    summary = {"GPQA-Diamond": {"pass@1": 0.30}, "ARC-c": {"pass@1": 0.80}, "MMLU-Pro": {"pass@1": 0.40},
               "MATH-500": {"pass@1": 0.70}, "AIME24": {"pass@1": 0.10, "samples": 32.0},
               "average": {"pass@1": 0.46}}
    header, rows = R.results_table({"ExGRPO": summary, "GRPO": {"ARC-c": {"pass@1": 0.5}, "average": {"pass@1": 0.5}}})
    assert header == ["run", "AIME24 (avg@32)", "MATH-500", "ID Avg", "ARC-c", "GPQA-Diamond", "MMLU-Pro",
                      "OOD Avg", "Avg."]
    # ID Avg (10 + 70) / 2 = 40; OOD Avg (80 + 30 + 40) / 3 = 50; a run without ID benchmarks has no ID Avg
    assert rows == [["ExGRPO", 10.0, 70.0, 40.0, 80.0, 30.0, 40.0, 50.0, 46.0],
                    ["GRPO", None, None, None, 50.0, None, None, 50.0, 50.0]]


def test_a_benchmark_named_like_an_ood_one_is_not_put_in_a_group():
    header, _ = R.results_table({"r": {"arc-c-mine": {"pass@1": 0.5}, "average": {"pass@1": 0.5}}})
    assert header == ["run", "arc-c-mine", "Avg."]


def test_write_table_writes_markdown_csv_json_and_a_png(tmp_path):
    paths = R.write_table(SUMMARIES, tmp_path, stem="cmp")
    assert {p.name for p in paths.values()} == {"cmp.md", "cmp.csv", "cmp.json", "cmp.png"}
    with open(paths["csv"]) as f:
        rows = list(csv.reader(f))
    assert rows[0][-1] == "Avg." and rows[2][0] == "ExGRPO"
    assert json.loads(paths["json"].read_text()) == SUMMARIES
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_eval_keys_are_mlflow_safe_and_declared():
    from mlflow.utils.validation import validate_param_and_metric_name

    keys = [M.eval_key("AIME24", "pass@1"), M.eval_key("MATH-500", "pass@8"), M.eval_key("x/y z", "samples"),
            M.eval_key("average", "pass@1"), M.EVAL_SECONDS, M.EVAL_QUESTIONS_PER_S]
    assert keys[0] == "eval/AIME24/pass_at_1" and keys[2] == "eval/x_y z/samples"
    assert all(validate_param_and_metric_name(k) for k in keys)
    assert all(M.declared(k, 8) for k in keys)
    assert not M.declared("eval/AIME24/pass@1", 8) and not M.declared("eval/AIME24/made_up", 8)
    assert not any(k.startswith(M.EVAL_PREFIX) for k in M.STEP_METRICS)
