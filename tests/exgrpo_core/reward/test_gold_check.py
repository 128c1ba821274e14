"""Pathological gold answers are checked once at load time, with the timeout, and never cost it again."""

from __future__ import annotations

import json

import pytest

from exgrpo_core.config.load import load_config
from exgrpo_core.reward.grading import MathVerifier
from exgrpo_core.run.session import open_session

NESTED, PARENS = "\\frac{" * 10_000, "(" * 20_000


def test_bad_golds_are_found_once_and_then_scored_without_a_timeout():
    with MathVerifier(timeout_s=1.0) as v:
        bad = v.check_golds(["2", NESTED, PARENS, "2"])
        assert set(bad) == {NESTED, PARENS} and set(bad.values()) <= {"timeout", "error"}
        assert v.timeouts == 0  # the metric counts graded responses only
        out = v.verify(["\\boxed{2}"] * 4, ["2", NESTED, PARENS, NESTED])
        assert out[0] == (1.0, "correct") and out[1:] == [(0.0, "error")] * 3
        assert v.timeouts == 0, "a known-bad gold paid a timeout again"


def test_a_session_skips_questions_with_unusable_golds_naming_their_lines(tmp_path):
    data = tmp_path / "train.jsonl"
    rows = [{"question": "1+1", "answer": "2"}, {"question": "bad", "answer": PARENS},
            {"question": "2+2", "answer": "4"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config("tiny", [f"run.output_dir={tmp_path}", f"run.db_url=sqlite:///{tmp_path / 'x.db'}",
                               f"data.train_path={data}", "reward.timeout_s=1"])
    with pytest.warns(UserWarning, match=r"1 of 3 questions skipped.*train.jsonl line 2 \((timeout|error)\)"):
        s = open_session(cfg)
    try:
        assert sorted(q.answer for q in s.questions.values()) == ["2", "4"]
    finally:
        s.close()
