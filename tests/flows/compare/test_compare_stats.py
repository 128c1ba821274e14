"""The comparison's statistics on stored runs with known numbers: step-0 evaluation, area under the
held-out curve, paired differences against on_policy, replays by source bucket, per-question results,
and reading a finished child back without training it (flows/compare/report.py, stats.py)."""

from __future__ import annotations

import itertools
import json
import math
import uuid
from pathlib import Path

import pytest
import scipy.stats

from exgrpo_core import metrics as M
from exgrpo_core.config.load import load_config
from exgrpo_core.evaluation import stats
from exgrpo_core.store.experience_store import ExperienceStore
from exgrpo_core.types import GroupResult, Question, Rollout
from flows.compare import report, stats as compare_stats
from flows.compare.flow import finished_summary


def _run(store: ExperienceStore, groups_per_step: list[list[tuple[str, int, bool]]], name: str | None = None) -> str:
    """A stored run at K = 4 whose step i holds groups (question uid, k correct, is_replay)."""
    run_id = uuid.uuid4().hex
    store.start_run(run_id, name or f"r-{run_id[:6]}", "tiny", {}, 4)
    store.register_questions(run_id, [Question(uid=f"q{i}", messages=({"role": "user", "content": f"{i} {run_id}"},),
                                               answer="1") for i in range(4)])
    for step, groups in enumerate(groups_per_step):
        rows = [GroupResult(uid, [Rollout(uid, [1], [2 + j], [-0.1], f"{j}", False, step, reward=float(j < k))
                                  for j in range(3 if rep else 4)], is_replay=rep, replayed=int(rep))
                for uid, k, rep in groups]
        store.apply_buffer_update(run_id, step, rows, group_size=4, collect=False, collect_min_k=1,
                                  collect_max_k=3, retire=False, store_all=False)
        store.log_metrics(run_id, step, {M.RESPONSES: sum(3 if r else 4 for _, _, r in groups), M.REWARD_MEAN: 0.5,
                                         M.REPLAYED_SAMPLES: sum(r for _, _, r in groups), M.bucket_key(2): step})
    return run_id


def test_replays_are_counted_by_the_bucket_their_question_came_from(tmp_path):
    store = ExperienceStore(f"sqlite:///{tmp_path / 'e.db'}")
    run = _run(store, [[("q0", 2, False), ("q1", 1, False)], [("q0", 2, True), ("q2", 0, False)],
                       [("q0", 1, True), ("q1", 2, True)]])
    # a replay group's k counts its replayed (correct) trajectory: q0 is in bucket 3 after step 1
    assert store.replay_buckets(run) == {1: 1, 2: 1, 3: 1}  # q0 from 2 then 3, q1 from 1
    store.close()


def test_step_zero_evaluation_area_and_per_question_results(tmp_path):
    store = ExperienceStore(f"sqlite:///{tmp_path / 'e.db'}")
    run = _run(store, [[("q0", 2, False), ("q1", 1, False)]] * 4)  # 8 responses per step
    for step, v in ((-1, 0.2), (1, 0.4), (3, 0.4)):
        store.save_eval(run, step, "arith", {"pass@1": v}, 4)
    for step, c in ((-1, 1), (3, 3)):
        folder = tmp_path / "eval" / f"step_{step:06d}"
        folder.mkdir(parents=True)
        (folder / "samples.jsonl").write_text(json.dumps({"uid": "q0", "n": 4, "correct": c}) + "\n")
    out = report.arm_result(store, run, "exgrpo", 0, 8, None, eval_dir=tmp_path / "eval", target_weights={1: 1.0})
    c, row = out["curves"], out["row"]
    assert c["heldout_step"] == [-1, 1, 3] and c["heldout_responses"] == [0.0, 16, 32]
    assert row["heldout_start"] == 0.2 and row["heldout_auc"] == pytest.approx((0.6 + 0.8) / 4)  # x = 0, 2, 4
    assert c["buckets"]["2"] == [0, 1, 2, 3] and row["target_weights"] == {1: 1.0}
    assert row["bucket_occupancy"][2] == pytest.approx(1.5)  # mean size of bucket 2 over the 4 steps
    assert out["questions"]["first"] == {"step": -1, "correct": {"q0": 1}, "n": {"q0": 4}}
    assert out["questions"]["last"]["step"] == 3 and out["questions"]["last"]["correct"] == {"q0": 3}
    store.close()


def _row(arm, seed, final, start, auc, reach, buckets=None):
    return {"arm": arm, "seed": seed, "heldout_avg": final, "heldout_start": start, "heldout_auc": auc,
            "slots_to_target": reach, "replay_buckets": buckets or {}, "target_weights": {1: 1.0, 2: 3.0},
            "bucket_occupancy": {1: seed + 1.0, 2: 10.0 * seed}}


def test_paired_statistics_against_on_policy_use_matched_seeds_only():
    nan = math.nan
    rows = [_row("on_policy", 0, 0.50, 0.3, 0.40, 640), _row("on_policy", 1, 0.60, 0.3, 0.45, nan),
            _row("on_policy", 2, 0.55, 0.3, 0.42, 320),
            _row("exgrpo", 0, 0.60, 0.3, 0.50, 320, {1: 2, 2: 2}), _row("exgrpo", 1, 0.66, 0.3, 0.47, 640, {2: 4}),
            _row("exgrpo", 2, 0.60, 0.3, 0.46, 160), _row("exgrpo", 3, 0.99, 0.3, 0.99, 10)]  # seed 3: unpaired
    p = compare_stats.paired_stats(rows)["exgrpo"]
    final = p["heldout_avg"]
    assert final["n"] == 3 and final["paired_seeds"] == 3 and final["mean"] == pytest.approx(0.07)
    assert final["differences"] == pytest.approx({"0": 0.1, "1": 0.06, "2": 0.05})
    assert final["verdict"] == "ahead" and final["t_lo"] > 0 and final["arm_mean"] == pytest.approx(0.62)
    assert p["heldout_gain"]["mean"] == pytest.approx(final["mean"])  # equal starts: gain difference = final's
    reach = p["slots_to_target"]  # seed 1: on_policy never reached -> differences on seeds 0 and 2
    assert reach["n"] == 2 and reach["differences"] == {"0": -320.0, "2": -160.0}
    # the means are over those two seeds only: (320 + 160) / 2 and (640 + 320) / 2, not over every seed
    assert reach["arm_mean"] == pytest.approx(240.0) and reach["baseline_mean"] == pytest.approx(480.0)
    # seed 1 is censored, not dropped: only exgrpo reached the target, so it counts as exgrpo first;
    # 3 of 3 determined pairs one way: exact sign test p = 2 / 2^3
    c = reach["censored"]
    assert (c["earlier"], c["later"], c["only_arm"], c["only_baseline"]) == (3, 0, 1, 0)
    assert reach["p"] == pytest.approx(0.25) and (reach["ahead"], reach["behind"]) == (3, 0)
    assert reach["verdict"] == "null" and reach["final_verdict"] == "null (censored sign test p 0.250)"
    clear = compare_stats._lower_is_better(stats.summarise_differences([-300.0, -320.0, -310.0]))
    assert clear["verdict"] == "ahead" and (clear["ahead"], clear["behind"]) == (3, 0) and clear["t_hi"] < 0
    worse = compare_stats._lower_is_better(stats.summarise_differences([300.0, 320.0, 310.0]))
    assert worse["verdict"] == "behind" and (worse["ahead"], worse["behind"]) == (0, 3)
    md = "\n".join(compare_stats.markdown(compare_stats.paired_stats(rows), compare_stats.replay_buckets(rows)))
    assert "| exgrpo | final held-out pass@1 | 3/3 | +0.070 |" in md  # main paired table; means in the details
    assert "| exgrpo | final held-out pass@1 | 0.620 | 0.550 |" in md
    assert final["p"] == pytest.approx(stats.t_test_p([0.1, 0.06, 0.05]))
    # one arm: the family is its final and area comparisons (2), Holm doubles the smaller p at most
    assert final["holm_family"] == 2 and final["p_holm"] >= final["p"]
    ps = {k: p[k]["p"] for k in compare_stats.HOLM_METRICS}
    assert max(p[k]["p_holm"] for k in ps) == pytest.approx(max(min(1.0, 2 * min(ps.values())), max(ps.values())))
    assert "p_holm" not in p["slots_to_target"]
    assert "over the 2 final and area comparisons" in md
    assert "| exgrpo | 2 (0.25 vs 0.25) | 6 (0.75 vs 0.75) |" in md
    assert "| exgrpo: mean questions in bucket | 2.5 | 15.0 |" in md  # seeds 0-3: (1+2+3+4)/4, (0+10+20+30)/4


def test_a_null_says_how_large_a_difference_the_interval_allows():
    rows = [_row("on_policy", s, v, 0.3, 0.4, 100) for s, v in enumerate((0.5, 0.6, 0.55))]
    rows += [_row("no_policy_shaping", s, v, 0.3, 0.4, 100) for s, v in enumerate((0.55, 0.52, 0.58))]
    s = compare_stats.paired_stats(rows)["no_policy_shaping"]["heldout_avg"]
    assert s["verdict"] == "null" and s["final_verdict"] == f"null: |diff| < {s['bound']:.3f} at 95%"
    assert s["bound"] == pytest.approx(max(-s["t_lo"], s["t_hi"]))
    assert compare_stats.paired_stats([r for r in rows if r["arm"] != "on_policy"]) == {}


def test_a_finished_child_is_read_back_and_an_unfinished_one_trains(tmp_path):
    cfg = load_config("tiny", [f"run.output_dir={tmp_path}", "run.name=c-exgrpo-s0", "run.steps=2"])
    assert finished_summary(cfg) is None  # no run folder yet
    run_dir = Path(tmp_path) / "c-exgrpo-s0"
    run_dir.mkdir()
    store = ExperienceStore(f"sqlite:///{run_dir / 'experience.db'}")
    run = _run(store, [[("q0", 2, False)]] * 2, name="c-exgrpo-s0")
    store.update_run(run, step=1, status="running")
    assert finished_summary(cfg) is None
    store.update_run(run, status="finished", mlflow_run_id="m1")
    store.close()
    assert finished_summary(cfg) == {"run_id": run, "run_dir": str(run_dir), "mlflow_run_id": "m1"}
    assert finished_summary(cfg.model_copy(update={"run": cfg.run.model_copy(update={"steps": 5})})) is None


def test_collapsed_runs_are_counted_and_tested_on_paired_seeds():
    nan = math.nan
    rows = [_row("on_policy", s, 0.01, 0.3, 0.1, nan) for s in range(6)]  # every on_policy seed collapses
    rows += [_row("exgrpo", s, 0.2, 0.3, 0.2, nan) for s in range(6)]  # none of exgrpo's (0.2 >= 0.15)
    rows += [_row("exgrpo", 9, 0.1, 0.3, 0.1, nan)]  # unpaired and collapsed
    c = compare_stats.collapses(rows)
    assert c["on_policy"]["collapsed"] == 6 and c["exgrpo"]["collapsed"] == 1 and c["exgrpo"]["runs"] == 7
    assert (c["exgrpo"]["only_arm"], c["exgrpo"]["only_baseline"], c["exgrpo"]["paired_seeds"]) == (0, 6, 6)
    assert c["exgrpo"]["p_mcnemar"] == pytest.approx(2 / 64)
    md = "\n".join(compare_stats.markdown(compare_stats.paired_stats(rows), {}, c))
    assert "| exgrpo | 1 / 7 | 6 | 0 | 6 | 0.031 | fewer collapses |" in md


def test_the_verdict_uses_the_holm_p_and_marks_uncorrected_results_as_hints():
    # final: every seed behind (t-interval excludes 0, p < 0.05); area: noise (p ~ 1), so Holm doubles final's p
    finals = (-0.010, -0.003, -0.008, 0.000, -0.009, -0.001)
    areas = (0.01, -0.01, 0.005, -0.004, 0.002, -0.003)
    rows = [_row("on_policy", s, 0.5, 0.3, 0.4, 100) for s in range(6)]
    rows += [_row("exgrpo", s, 0.5 + f, 0.3, 0.4 + a, 100) for s, (f, a) in enumerate(zip(finals, areas))]
    p = compare_stats.paired_stats(rows)["exgrpo"]
    raw = scipy.stats.ttest_1samp(finals, 0.0).pvalue  # 0.034; Holm over 2 tests with the larger p ~0.9
    raw_area = scipy.stats.ttest_1samp(areas, 0.0).pvalue
    assert p["heldout_avg"]["p"] == pytest.approx(raw)
    assert p["heldout_avg"]["p_holm"] == pytest.approx(max(2 * min(raw, raw_area), 0))
    assert 0.05 <= 2 * raw and p["heldout_avg"]["verdict"] == "behind"  # significant only before correction
    assert p["heldout_avg"]["final_verdict"] == (f"hint: behind (uncorrected p {raw:.3f}; "
                                                 f"Holm p {min(1, 2 * raw):.3f})")
    assert p["heldout_gain"]["final_verdict"].startswith("hint: behind") and \
        "not in the corrected family" in p["heldout_gain"]["final_verdict"]
    md = "\n".join(compare_stats.markdown(compare_stats.paired_stats(rows), {}))
    assert "| hint: behind (uncorrected p" in md and "\\|diff\\| <" in md
    assert "p sign-flip" in md and " (n < 8) |" in md  # 6 seeds: the bootstrap interval carries the flag
    # sign-flip by enumeration: the patterns whose |sum| reaches the observed 0.031 (the 0 flips both ways)
    sums = [abs(sum(e * f for e, f in zip(signs, finals))) for signs in itertools.product((1, -1), repeat=6)]
    assert p["heldout_avg"]["p_signflip"] == pytest.approx(sum(v >= 0.031 - 1e-12 for v in sums) / 64)


def test_holm_across_comparisons_corrects_over_the_whole_family():
    tables = {"a": {"x": {"heldout_avg": {"p": 0.01, "verdict": "ahead"}, "heldout_auc": {"p": 0.04, "verdict": "ahead"}}},
              "b": {"y": {"heldout_avg": {"p": 0.03, "verdict": "ahead"}, "heldout_auc": {"p": 0.5, "verdict": "null",
                                                                                          "bound": 0.004, "level": 0.95}}}}
    got = compare_stats.holm_across(tables)
    # sorted 0.01, 0.03, 0.04, 0.5: x 4, x 3, x 2, x 1 -> 0.04, 0.09, 0.09 (monotone), 0.5
    assert got == pytest.approx({("a", "x", "heldout_avg"): 0.04, ("b", "y", "heldout_avg"): 0.09,
                                 ("a", "x", "heldout_auc"): 0.09, ("b", "y", "heldout_auc"): 0.5})
    assert tables["a"]["x"]["heldout_avg"]["family_verdict"] == "ahead"
    assert tables["b"]["y"]["heldout_avg"]["family_verdict"].startswith("hint: ahead (uncorrected p 0.030; Holm p 0.090")
    assert tables["b"]["y"]["heldout_auc"]["family_size"] == 4


def test_pairs_that_all_tie_at_the_target_are_a_null_not_too_few_seeds():
    rows = [_row("on_policy", s, 0.01, 0.3, 0.1, 0.0) for s in range(3)]  # both arms "reach" it at step 0
    rows += [_row("exgrpo", s, 0.02, 0.3, 0.1, 0.0) for s in range(3)]
    reach = compare_stats.paired_stats(rows)["exgrpo"]["slots_to_target"]
    assert reach["censored"]["undetermined"] == 3 and math.isnan(reach["p"])
    assert reach["final_verdict"] == "null: no pair ordered (3 tied or censored)"
