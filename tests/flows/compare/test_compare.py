"""Comparison pieces without Prefect: arm configs (flows/compare/arms.py) and the table built from
stored metrics (flows/compare/report.py), on a real SQLite experience store.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from exgrpo_core import metrics as M
from exgrpo_core.config.load import ConfigError
from exgrpo_core.store.experience_store import ExperienceStore
from exgrpo_core.types import GroupResult, Question, Rollout
from flows.compare import report
from flows.compare.arms import (ARMS, DEFAULT_ARMS, LAB_ARMS, build_arm_runs, check_equal_slots, parse_arms,
                                parse_seeds, run_name)

ROOT = Path(__file__).resolve().parents[3]


def test_every_arm_gets_its_overrides_a_stable_unique_name_and_the_seed():
    runs = build_arm_runs("tiny", None, None, [0, 3], "cmp", evaluate=False)  # no arms named: the ablation table's
    assert [(r.arm, r.seed) for r in runs] == [(a, s) for a in DEFAULT_ARMS for s in (0, 3)]
    assert len(DEFAULT_ARMS) == 9 and set(ARMS) - set(DEFAULT_ARMS) == {"mu_0.25", "no_is_correction", "review_retired",
                                                                        *LAB_ARMS}
    assert set(LAB_ARMS) >= {"prompt_replay", "max_age_8", "age_decay", "dynamic_sampling", "on_policy_ds",
                             "seq_tis", "seq_mask"}
    by = {(r.arm, r.seed): r.cfg for r in runs}
    assert by["on_policy", 0].buffer.replay_ratio == 0 and by["exgrpo", 0].buffer.replay_ratio == 0.5
    assert by["rho_0.25", 3].buffer.replay_ratio == 0.25 and by["rho_0.75", 0].buffer.replay_ratio == 0.75
    assert by["no_question_selection", 0].selection.question_weighting == "question_uniform"
    assert by["no_question_selection", 0].selection.trajectory == "argmin"
    assert by["no_trajectory_selection", 0].selection.trajectory == "random"
    assert by["no_trajectory_selection", 0].selection.question_weighting == "gaussian"
    assert by["no_selection", 0].selection.trajectory == "random"
    assert by["no_selection", 0].selection.question_weighting == "question_uniform"
    assert by["highest_entropy", 0].selection.trajectory == "argmax"
    assert by["no_policy_shaping", 0].loss.policy_shaping is False
    assert by["exgrpo", 0].loss.policy_shaping is True
    names = [r.cfg.run.name for r in runs]
    assert len(set(names)) == len(names) and by["exgrpo", 3].run.name == "cmp-exgrpo-s3" == run_name("cmp", "exgrpo", 3)
    assert {r.cfg.run.seed for r in runs if r.seed == 3} == {3}
    # same data, batch and group size everywhere: the B*K slots per step are equal
    assert len({(c.data.train_path, c.train.batch_size, c.rollout.group_size, c.run.steps) for c in by.values()}) == 1
    # a rerun builds the same names (so the children resume)
    assert names == [r.cfg.run.name for r in build_arm_runs("tiny", None, None, [0, 3], "cmp", evaluate=False)]


def test_user_overrides_reach_every_arm_but_the_arm_wins():
    runs = build_arm_runs("tiny", ["buffer.replay_ratio=0.3", "run.steps=4", "run.name=ignored"],
                          "on_policy,exgrpo,rho_0.25", "0", "c", evaluate=False)
    assert [r.cfg.buffer.replay_ratio for r in runs] == [0, 0.3, 0.25]
    assert {r.cfg.run.steps for r in runs} == {4}
    assert [r.cfg.run.name for r in runs] == ["c-on_policy-s0", "c-exgrpo-s0", "c-rho_0.25-s0"]


def test_final_evaluation_is_switched_on_only_when_there_is_held_out_data():
    assert not build_arm_runs("tiny", ["eval.suites=[]"], "exgrpo", [0], "c", evaluate=True)[0].cfg.eval.final
    with_suite = build_arm_runs("tiny", ["eval.suites=[bundled:tiny-arith]"], "exgrpo", [0], "c", evaluate=True)
    assert with_suite[0].cfg.eval.final
    assert not build_arm_runs("tiny", ["eval.suites=[bundled:tiny-arith]"], "exgrpo", [0], "c",
                              evaluate=False)[0].cfg.eval.final


@pytest.mark.parametrize("arms, message", [("exgrpo,nope", "unknown comparison arm(s) ['nope']"),
                                           (",", "no comparison arm"), ("exgrpo,exgrpo", "repeat")])
def test_bad_arms_are_one_clear_error(arms, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        parse_arms(arms)


def test_comparison_names_that_cannot_be_folders_or_tags_are_refused():
    for bad in ("a b", "x'y", "../up", ""):
        with pytest.raises(ConfigError, match="comparison name"):
            build_arm_runs("tiny", None, "exgrpo", [0], bad, evaluate=False)


def test_seeds_parse_and_bad_seeds_are_errors():
    assert parse_seeds("0, 2") == [0, 2] and parse_seeds([1]) == [1]
    for bad in ("a", "", "1,1"):
        with pytest.raises(ConfigError, match="seeds"):
            parse_seeds(bad)


def test_arms_with_different_batch_or_group_size_are_refused():
    runs = build_arm_runs("tiny", None, "on_policy,exgrpo", [0], "c", evaluate=False)
    runs[1].cfg.train.batch_size = 16
    runs[1].cfg.train.mini_batch_size = 16
    with pytest.raises(ConfigError, match=r"arms differ in rollout budget.*64.*128"):
        check_equal_slots(runs)


def test_cli_unknown_arm_exits_2_before_any_work(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "compare", "--config", "tiny", "--arms", "exgrpo,gpt"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PREFECT_API_URL": "http://127.0.0.1:9/api"})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "unknown comparison arm(s) ['gpt']" in proc.stdout.replace("\n", " ")
    assert "Traceback" not in proc.stdout + proc.stderr


# ---- the table from stored metrics --------------------------------------------------------------------

def _child(store: ExperienceStore, plan: list[tuple[int, int, int]], rewards: list[float], name: str = "") -> str:
    """A stored run whose step i had plan[i] = (fresh groups, experiential groups, replayed) at K = 8."""
    run_id = uuid.uuid4().hex
    store.start_run(run_id, name or f"c-{run_id[:6]}", "tiny", {}, 8)
    store.register_questions(run_id, [Question(uid=f"q{i}", messages=({"role": "user", "content": f"{i} {run_id}"},),
                                               answer="1") for i in range(16)])
    for step, ((fresh, exp, replayed), w) in enumerate(zip(plan, rewards)):
        groups = [GroupResult(f"q{i}", [Rollout(f"q{i}", [1], [2 + j], [-0.1], f"{j}", False, step, reward=0.0)
                                        for j in range(8 if i < fresh else 7)],
                              is_replay=i >= fresh, replayed=int(i >= fresh)) for i in range(fresh + exp)]
        store.apply_buffer_update(run_id, step, groups, group_size=8, collect=False, collect_min_k=1,
                                  collect_max_k=7, retire=False, store_all=False)
        store.log_metrics(run_id, step, {M.RESPONSES: 8 * fresh + 7 * exp, M.REPLAYED_SAMPLES: replayed,
                                         M.REWARD_MEAN: w, M.FRESH_PASS1: w / 2, M.BUFFER_QUESTIONS: step * 2,
                                         M.BUFFER_TRAJECTORIES: step * 3, M.RETIRED_QUESTIONS: step})
    return run_id


def test_rows_budget_and_files_match_the_stored_metrics(tmp_path):
    store = ExperienceStore(f"sqlite:///{tmp_path / 'e.db'}")
    a = _child(store, [(8, 0, 0)] * 3, [0.1, 0.2, 0.4])
    b = _child(store, [(8, 0, 0), (4, 4, 4), (5, 3, 2)], [0.1, 0.3, 0.5])  # one replay slot unfilled at step 2
    results = [report.arm_result(store, a, "on_policy", 0, 64, 45.3), report.arm_result(store, b, "exgrpo", 0, 64, 48.3)]
    ra, rb = results[0]["row"], results[1]["row"]
    assert ra["final_reward"] == 0.4 and math.isclose(ra["mean_reward"], 0.7 / 3) and ra["final_fresh_pass1"] == 0.2
    assert (rb["responses_generated"], rb["responses_per_step_min"], rb["responses_per_step_max"]) == (185, 60, 64)
    assert (rb["replayed"], rb["unfilled"], ra["unfilled"]) == (6, 1, 0) and rb["slots_ok"] and ra["slots_ok"]
    assert (rb["buffer_questions"], rb["buffer_trajectories"], rb["retired"]) == (4, 6, 2)
    assert results[1]["curves"]["responses_cumulative"] == [64, 124, 185]
    report.check_budget(results)  # 64 slots and generated = 64 - experiential at every step

    paths = report.write_report(results, tmp_path / "out", "t", {"notes": ["hello"], "preset": "tiny"})
    md = Path(paths["md"]).read_text()
    assert "| exgrpo | 0 | 0.500 | — | — | — | 185 | — | yes |" in md  # the main table; details below
    assert "| exgrpo | 0 | 60 | 64 | 6 | 1 | 7 | 64 | yes |" in md and "| exgrpo | 0 | 0.300 | 0.250 | 4 | 6 | 2 | 48.3 |" in md
    doc = json.loads(Path(paths["json"]).read_text())
    assert doc["rows"][0]["run_id"] == a and doc["curves"]["exgrpo/s0"]["rollout/reward_mean"] == [0.1, 0.3, 0.5]
    assert doc["rows"][0]["heldout_avg"] is None  # NaN -> null: standard JSON
    csv_lines = Path(paths["csv"]).read_text().splitlines()
    assert csv_lines[0].startswith("arm,seed,final reward") and csv_lines[1].startswith("on_policy,0,0.400")
    for kind in ("png_reward", "png_heldout", "png_buffer", "png_retired"):
        assert Path(paths[kind]).read_bytes()[:4] == b"\x89PNG"

    c = _child(store, [(8, 0, 0), (4, 3, 3)], [0.0, 0.0])  # a step of 7 questions: 56 slots
    bad = report.arm_result(store, c, "rho_0.75", 1, 64, None)
    assert not bad["row"]["slots_ok"]
    with pytest.raises(report.BudgetError, match=r"\('rho_0.75', 1, 1, 56, 3, 53.0, 3.0\)"):
        report.check_budget([*results, bad])
    store.close()


def test_mean_rows_average_each_arm_over_seeds(tmp_path):
    store = ExperienceStore(f"sqlite:///{tmp_path / 'e.db'}")
    results = [report.arm_result(store, _child(store, [(8, 0, 0)], [w]), "exgrpo", s, 64, 48.3)
               for s, w in ((0, 0.2), (1, 0.6))]
    (mean,) = report.mean_rows([r["row"] for r in results])
    assert mean["seed"] == "mean" and math.isclose(mean["final_reward"], 0.4) and mean["responses_generated"] == 64
    md = Path(report.write_report(results, tmp_path, "m", {})["md"]).read_text()
    assert "| exgrpo | mean | 0.400 |" in md
    store.close()


def test_held_out_columns_come_from_the_latest_stored_evaluation(tmp_path):
    store = ExperienceStore(f"sqlite:///{tmp_path / 'e.db'}")
    run = _child(store, [(8, 0, 0)], [0.5])
    store.save_eval(run, 0, "arith", {"pass@1": 0.1}, 4)
    store.save_eval(run, 5, "arith", {"pass@1": 0.25}, 4)
    store.save_eval(run, 5, "gsm8k", {"pass@1": 0.75}, 4)
    r = report.arm_result(store, run, "exgrpo", 0, 64, None)["row"]
    assert r["heldout"] == {"arith": 0.25, "gsm8k": 0.75} and r["heldout_avg"] == 0.5
    header, cells = report.table_rows([r])
    assert header[5:7] == ["arith pass@1", "gsm8k pass@1"] and cells[0][5:8] == ["0.250", "0.750", "0.500"]
    store.close()


def test_slots_to_reach_on_policy_final_held_out(tmp_path):
    store = ExperienceStore(f"sqlite:///{tmp_path / 'e.db'}")
    plan = [(8, 0, 0)] * 4  # 64 generated per step: cumulative 64, 128, 192, 256
    evals = {"on_policy": [[(1, 0.2), (3, 0.4)], [(1, 0.3), (3, 0.5)]],  # target: final mean 0.45
             "exgrpo": [[(1, 0.5), (3, 0.6)], [(1, 0.1), (3, 0.3)]]}    # seed 1 never gets there
    results = []
    for arm, per_seed in evals.items():
        for seed, points in enumerate(per_seed):
            run = _child(store, plan, [0.1] * 4)
            for step, v in points:
                store.save_eval(run, step, "arith", {"pass@1": v}, 4)
            results.append(report.arm_result(store, run, arm, seed, 64, None))
    assert results[0]["curves"]["heldout_responses"] == [128, 256]
    assert results[0]["curves"]["heldout_pass1"] == [0.2, 0.4]
    assert report.add_slots_to_target(results) == pytest.approx(0.45)
    reach = [r["row"]["slots_to_target"] for r in results]  # 64 slots a step: after step 3, 4 x 64
    assert math.isnan(reach[0]) and reach[1:3] == [256, 128] and math.isnan(reach[3])
    means = {m["arm"]: m for m in report.mean_rows([r["row"] for r in results])}
    assert math.isnan(means["exgrpo"]["slots_to_target"]), "a seed that never reached it makes the mean never"
    assert math.isnan(means["on_policy"]["slots_to_target"])
    paths = report.write_report(results, tmp_path / "out", "h", {})
    assert Path(paths["png_heldout"]).read_bytes()[:4] == b"\x89PNG"
    store.close()


def test_a_comparison_of_continuous_reward_runs_says_what_its_rewards_are(tmp_path):
    store = ExperienceStore(f"sqlite:///{tmp_path / 'e.db'}")
    binary = report.arm_result(store, _child(store, [(8, 0, 0)], [0.5]), "exgrpo", 0, 64, None)
    plain = Path(report.write_report([binary], tmp_path / "b", "b", {})["md"]).read_text()
    run_id = uuid.uuid4().hex
    store.start_run(run_id, "cont", "tiny", {"reward": {"fn": "arith_format", "kind": "auto"}}, 8)
    cont = report.arm_result(store, run_id, "exgrpo", 1, 64, None)
    md = Path(report.write_report([binary, cont], tmp_path / "c", "c", {})["md"]).read_text()
    assert not binary["row"]["continuous"] and cont["row"]["continuous"]
    assert "Continuous rewards" not in plain and "*fresh pass@1* are mean rewards" in md
    store.close()
