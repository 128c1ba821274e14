"""Verifier audit: what the grader read is recorded per response, training grades each row with its
data's grader (as evaluation does), and `reverify` reports disagreements, changing nothing unless asked."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import pytest
from store_helpers import dump_run

from exgrpo_core import loop
from exgrpo_core.config.load import load_config
from exgrpo_core.reward import audit, grading
from exgrpo_core.reward.reverify import reverify
from exgrpo_core.run.session import open_session
from exgrpo_core.store.experience_store import ExperienceStore, StoreError
from exgrpo_core.types import Question


def test_describe_reads_what_each_grader_reads():
    assert audit.describe("so 2+3 = \\boxed{5}.", "5", "math") == ("5", "$5$")
    assert audit.describe("1,234 apples", "#### 1,234", "math") == ("1234", "$1234$")
    assert audit.describe("I think the answer is (c)", "(C)", "choice") == ("C", "C")
    assert audit.describe("no think here \\boxed{5}", "5", "math", require_think=True) == (None, "$5$")
    assert audit.describe("<think>x</think> \\boxed{7}", "5", "math", require_think=True) == ("7", "$5$")
    assert audit.version("choice") == f"rules-{grading.RULES_VERSION}"
    assert audit.version("math").startswith(f"rules-{grading.RULES_VERSION}+math-verify-0.")
    with pytest.raises(ValueError, match="unknown grader"):
        audit.version("llm")


def test_training_grades_choice_rows_by_their_letter_and_records_the_audit_fields():
    seen: list[str] = []

    def math_only(texts, answers):
        seen.extend(texts)
        return [(1.0, "correct") if t.endswith("{2}") else (0.0, "wrong") for t in texts]

    cfg = load_config("tiny", ["buffer.replay_ratio=0"])
    qs = {"m": Question("m", (), "2", "arith"), "c": Question("c", (), "B", "my_quiz", "choice"),
          "g": Question("g", (), "C", "gpqa")}
    rows = [loop.Rollout(u, [1], [2], [0.0], text, False, 0) for u, text in
            (("m", "1+1 = \\boxed{2}"), ("c", "The answer is B"), ("g", "ANSWER: D"), ("m", "no idea"))]
    s = SimpleNamespace(cfg=cfg, replay_active=False, step=0, questions=qs, verify=math_only)
    loop.verify(s, rows)
    assert seen == ["1+1 = \\boxed{2}", "no idea"]  # the choice rows never reach math-verify
    assert [r.reward for r in rows] == [1.0, 1.0, 0.0, 0.0]
    assert [(r.verifier, r.prediction, r.gold) for r in rows] == [
        ("math", "2", "$2$"), ("choice", "B", "B"), ("choice", "D", "C"), ("math", None, "$2$")]
    assert [r.verifier_version for r in rows] == [audit.version(g) for g in ("math", "choice", "choice",
                                                                                       "math")]


def exact(texts, answers):
    return [(1.0, "correct") if t.strip() == a else (0.0, "wrong") for t, a in zip(texts, answers)]


def any_digit(texts, answers):
    """A looser grader: any single digit counts (stands in for a verifier whose rules changed)."""
    return [(1.0, "correct") if t.strip().isdigit() else (0.0, "wrong") for t in texts]


def test_reverify_reports_disagreements_and_changes_rewards_only_when_asked(tmp_path):
    cfg = load_config("tiny", [f"run.output_dir={tmp_path}", "run.name=audited", "run.steps=3"])
    s = open_session(cfg, verify=exact)
    for _ in range(3):
        loop.run_iteration(s)
    run_id = s.run_id
    s.close()
    store = ExperienceStore(f"sqlite:///{tmp_path / 'audited' / 'experience.db'}")
    rows = store.stored_trajectories(run_id)
    assert rows and all(r["verifier"] == "math" and r["verify_reason"] in ("correct", "wrong") for r in rows)
    expected = [r["id"] for r in rows if float(r["text"].strip().isdigit()) != r["reward"]]
    assert expected, "the tiny run should have produced digits other than the answer"
    before = hashlib.sha256(repr(dump_run(store, run_id)).encode()).hexdigest()
    out = reverify(store, "audited", verify=any_digit)
    assert [d["trajectory_id"] for d in out["disagreements"]] == expected
    assert out["summary"]["now_correct"] == len(expected) and out["summary"]["now_wrong"] == 0
    assert out["applied"] is None and store.reward_changes(run_id) == []
    assert hashlib.sha256(repr(dump_run(store, run_id)).encode()).hexdigest() == before  # nothing written
    applied = reverify(store, run_id, verify=any_digit, apply=True)
    assert applied["applied"] == {"changed": len(expected), "left_pool": 0}
    assert [c["trajectory_id"] for c in store.reward_changes(run_id)] == expected
    assert reverify(store, run_id, verify=any_digit)["summary"]["disagree"] == 0
    back = reverify(store, run_id, verify=exact, apply=True)  # stricter again: the same rows go back, recorded too
    assert back["summary"]["now_wrong"] == len(expected) and len(store.reward_changes(run_id)) == 2 * len(expected)
    with pytest.raises(StoreError, match="no run 'nope'"):
        reverify(store, "nope", verify=exact)
    store.close()


def test_reverify_refuses_to_guess_for_a_run_graded_by_a_reward_function(tmp_path):
    cfg = load_config("tiny", [f"run.output_dir={tmp_path}", "run.name=own", "run.steps=1", "reward.fn=exact_match"])
    s = open_session(cfg)
    loop.run_iteration(s)
    s.close()
    with ExperienceStore(f"sqlite:///{tmp_path / 'own' / 'experience.db'}") as store:
        with pytest.raises(StoreError, match="graded by reward.fn=exact_match: reverify regrades math-verify"):
            reverify(store, "own", verify=exact)
        assert reverify(store, "own", grader="math", verify=exact)["summary"]["trajectories"] > 0
