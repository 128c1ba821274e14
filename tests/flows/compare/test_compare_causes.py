"""Issue 34 item 7: the tiny comparison has a held-out suite, every paired statistic that cannot be computed
says why (never a bare "too few seeds"), and the report's Markdown tables stay narrow
(flows/compare/stats.py, report.py, configs/tiny.yaml)."""

from __future__ import annotations

import math
import uuid
from pathlib import Path

from exgrpo_core import metrics as M
from exgrpo_core.config.load import load_config
from exgrpo_core.data.questions import load_questions, prompt_token_ids
from exgrpo_core.evaluation.suites import load_suite
from exgrpo_core.models.build import build_tiny_tokenizer
from exgrpo_core.store.experience_store import ExperienceStore
from exgrpo_core.types import GroupResult, Question, Rollout
from flows.compare import report, stats as compare_stats
from flows.compare.arms import build_arm_runs

NAN = math.nan


def _row(arm, seed, final, start=NAN, auc=NAN, reach=NAN):
    return {"arm": arm, "seed": seed, "heldout_avg": final, "heldout_start": start, "heldout_auc": auc,
            "slots_to_target": reach, "replay_buckets": {}, "target_weights": {}, "bucket_occupancy": {}}


def _verdicts(rows, arm="exgrpo") -> dict:
    return {k: s["final_verdict"] for k, s in compare_stats.paired_stats(rows)[arm].items()}


def test_the_tiny_preset_evaluates_a_held_out_suite_in_comparisons():
    cfg = load_config("tiny")
    assert cfg.eval.suites == ["bundled:tiny-arith-test"] and not cfg.eval.final  # `exgrpo train` alone: no eval
    assert build_arm_runs("tiny", None, "exgrpo", [0], "c", evaluate=True)[0].cfg.eval.final
    items = load_suite(cfg.eval.suites[0])
    train = {q.text for q in load_questions(cfg.data.train_path)}
    assert len(items) == 45 and {i.benchmark for i in items} == {"tiny-arith-test"}
    assert not train & {i.question.text for i in items}, "held-out questions must not be trained on"
    tok = build_tiny_tokenizer()
    for i in items:  # one answer symbol (rollout.max_response_tokens: 1), every character in the tiny vocabulary
        assert i.question.answer in set("0123456789")
        assert tok.unk_token_id not in prompt_token_ids(tok, i.question, cfg.rollout.max_prompt_tokens)


def test_no_held_out_evaluation_is_the_cause_not_too_few_seeds():
    rows = [_row(arm, s, NAN) for arm in ("on_policy", "exgrpo") for s in range(3)]
    verdicts = _verdicts(rows)
    cause = "no statistic: no held-out evaluation in exgrpo and on_policy (eval.suites and data.eval_path empty, or --no-eval)"
    assert set(verdicts.values()) == {cause}
    md = "\n".join(compare_stats.markdown(compare_stats.paired_stats(rows), {}))
    assert "| too few seeds" not in md and md.count(cause.replace("|", "\\|")) == 4
    one_side = [r for r in rows if r["arm"] == "on_policy"] + [_row("exgrpo", s, 0.5, 0.4, 0.45) for s in range(3)]
    assert _verdicts(one_side)["heldout_avg"].startswith("no statistic: no held-out evaluation in on_policy (")


def test_no_step_zero_evaluation_names_eval_at_start_for_the_gain_and_the_area():
    rows = [_row("on_policy", s, 0.5 + s / 10) for s in range(3)] + [_row("exgrpo", s, 0.55 + s / 7) for s in range(3)]
    v = _verdicts(rows)
    assert v["heldout_gain"] == "no statistic: no step-0 evaluation in exgrpo and on_policy (eval.at_start off)"
    assert v["heldout_auc"] == ("no statistic: one held-out evaluation per run in exgrpo and on_policy: the area "
                                "needs two (eval.at_start or eval.every)")
    assert v["heldout_avg"].startswith("null: |diff| <")  # the final comparison is computed


def test_fewer_than_two_paired_seeds_names_the_seeds_each_arm_finished():
    rows = [_row("on_policy", s, 0.5, 0.4, 0.45, 100) for s in (0, 1)] + \
        [_row("exgrpo", s, 0.6, 0.4, 0.5, 90) for s in (1, 2)]
    expected = "no statistic: 1 paired seed (seeds exgrpo: [1, 2], on_policy: [0, 1]): a statistic needs 2"
    assert set(_verdicts(rows).values()) == {expected}
    p = compare_stats.paired_stats(rows)["exgrpo"]
    assert all(math.isnan(p[k]["p_holm"]) for k in compare_stats.HOLM_METRICS)  # out of the Holm family


def test_a_run_without_the_metric_leaves_one_seed_with_a_value():
    rows = [_row("on_policy", s, 0.5 + s / 10, 0.4, 0.45) for s in (0, 1)] + \
        [_row("exgrpo", 0, 0.7, 0.4, 0.5), _row("exgrpo", 1, NAN, 0.4, 0.5)]
    assert _verdicts(rows)["heldout_avg"] == ("no statistic: 1 of 2 paired seeds with a value in both arms (a run "
                                              "without the metric): a statistic needs 2")


def test_zero_variance_is_named_and_kept_out_of_the_holm_family():
    rows = [_row("on_policy", s, 0.3 + s / 10, 0.2, 0.25 + s / 10) for s in range(3)]
    rows += [_row("exgrpo", s, 0.35 + s / 10, 0.2, 0.25 + s / 10 + (s - 1) / 50) for s in range(3)]
    p = compare_stats.paired_stats(rows)["exgrpo"]
    assert p["heldout_avg"]["final_verdict"] == "no statistic: zero variance: every paired seed differs by +0.050"
    assert math.isnan(p["heldout_avg"]["p"]) and p["heldout_auc"]["holm_family"] == 1  # only the area is tested


def test_a_comparison_without_on_policy_says_so():
    rows = [_row("exgrpo", s, 0.5) for s in range(2)]
    assert compare_stats.paired_stats(rows) == {}
    assert compare_stats.unpaired_line(rows) == ("No paired statistics: no finished on_policy run to pair the arms "
                                                 "with (arms: exgrpo).")
    assert compare_stats.unpaired_line([_row("on_policy", 0, 0.5)]) == "No paired statistics: on_policy is the only arm."


# ---- the report's tables --------------------------------------------------------------------------------------

def _child(store: ExperienceStore, evals: dict[str, float]) -> str:
    """A stored one-step run at K = 8 (8 fresh groups) with a final evaluation per benchmark."""
    run_id = uuid.uuid4().hex
    store.start_run(run_id, f"c-{run_id[:6]}", "tiny", {}, 8)
    store.register_questions(run_id, [Question(uid=f"q{i}", messages=({"role": "user", "content": f"{i} {run_id}"},),
                                               answer="1") for i in range(8)])
    groups = [GroupResult(f"q{i}", [Rollout(f"q{i}", [1], [2 + j], [-0.1], f"{j}", False, 0, reward=0.0)
                                    for j in range(8)]) for i in range(8)]
    store.apply_buffer_update(run_id, 0, groups, group_size=8, collect=False, collect_min_k=1, collect_max_k=7,
                              retire=False, store_all=False)
    store.log_metrics(run_id, 0, {M.RESPONSES: 64, M.REPLAYED_SAMPLES: 0, M.REWARD_MEAN: 0.25, M.FRESH_PASS1: 0.25,
                                  M.BUFFER_QUESTIONS: 0, M.BUFFER_TRAJECTORIES: 0, M.RETIRED_QUESTIONS: 0})
    for bench, v in evals.items():
        store.save_eval(run_id, 0, bench, {"pass@1": v}, 4)
    return run_id


def _tables(md: str) -> list[list[str]]:
    """Every Markdown table's header cells (a header is the line above a |---| line)."""
    lines = md.splitlines()
    return [[c.strip() for c in lines[i - 1].strip("|").split("|")] for i, line in enumerate(lines)
            if line.startswith("|---")]


def test_the_report_splits_the_wide_table_and_the_csv_keeps_every_column(tmp_path):
    store = ExperienceStore(f"sqlite:///{tmp_path / 'e.db'}")
    benches = [f"b{i}" for i in range(11)]  # eleven benchmarks: the per-benchmark table splits too
    results = [report.arm_result(store, _child(store, {b: 0.1 * s + i / 100 for i, b in enumerate(benches)}),
                                 arm, s, 64, 45.3) for arm in ("on_policy", "exgrpo") for s in (0, 1)]
    paths = report.write_report(results, tmp_path / "out", "t", {"notes": ["n"]})
    md = Path(paths["md"]).read_text()
    tables = _tables(md)
    assert max(len(h) for h in tables) <= report.MAX_COLUMNS
    assert tables[0] == ["arm", "seed", "final reward", "held-out pass@1 avg", "held-out at step 0", "held-out AUC",
                         "responses generated", "slots to on-policy final held-out", "budget ok"]
    shown = {c for h in tables for c in h}
    header = Path(paths["csv"]).read_text().splitlines()[0].split(",")
    assert len(header) == 21 + len(benches) and set(header) <= shown  # every CSV column is in some table
    assert "### Held-out pass@1 per benchmark (2)" in md and "### Rollout budget" in md
    assert "| exgrpo | mean | 0.250 | 0.100 | — | — | 64 | — | yes |" in md
    store.close()


def test_an_empty_held_out_plot_says_why(tmp_path, monkeypatch):
    import matplotlib.axes

    said, text = [], matplotlib.axes.Axes.text
    monkeypatch.setattr(matplotlib.axes.Axes, "text", lambda self, x, y, s, *a, **k: said.append(s) or text(self, x, y, s, *a, **k))
    store = ExperienceStore(f"sqlite:///{tmp_path / 'e.db'}")
    results = [report.arm_result(store, _child(store, {}), "on_policy", 0, 64, None)]  # never evaluated
    report.plot(results, tmp_path, "t")
    assert said == ["no held-out pass@1 recorded (no held-out evaluation: eval.suites / eval.final)"]
    store.close()


def test_a_sweep_says_why_it_has_no_tuned_per_arm_comparison():
    from flows.compare import tuned_report

    grid = ["arm=on_policy,exgrpo", "train.lr=1e-5,1e-4"]
    labels = [f"{a} train.lr={x}" for a in ("arm=on_policy", "arm=exgrpo") for x in ("1e-5", "1e-4")]
    no_area = [{"arm": label, "seed": s, "heldout_auc": NAN} for label in labels for s in (0, 1)]
    assert tuned_report.why_no_section(no_area, grid).startswith("No tuned-per-arm comparison: no run has a held-out area")
    one_seed = [{"arm": label, "seed": s, "heldout_auc": 0.3} for label in labels for s in (0, 1)][:-1]  # a cell lacks seed 1
    assert tuned_report.why_no_section(one_seed, grid) == ("No tuned-per-arm comparison: 1 seed(s) with a held-out "
                                                           "area in every (arm, rate) cell [0]; it needs 2.")
    assert tuned_report.why_no_section(one_seed, ["train.lr=1e-5,1e-4"]) is None  # not arms x rates: nothing to say
