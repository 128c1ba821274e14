"""Tests of exgrpo_core/reward/grading.py: answer extraction, grading reasons, and the killable verifier pool.

Run: .venv/bin/python -m pytest tests/exgrpo_core/reward/test_rewards.py -q
"""

import time

import pytest

from exgrpo_core.reward.grading import REASONS, TEST_HOOKS_ENV, MathVerifier, extract_final_answer, gold_text, grade


@pytest.mark.parametrize("text, expected", [
    ("so 2+3 = \\boxed{5}.", "5"),
    ("first \\boxed{3}, then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # the last box wins
    ("\\boxed{\\left\\{1, 2\\right\\}}", "\\left\\{1, 2\\right\\}"),  # braces inside are balanced
    ("put it in \\boxed{} ... 2 + 3 = 5", "5"),  # an empty box (echoed instruction) is skipped
    ("\\boxed{7} and later \\boxed{8", "7"),  # an unclosed (truncated) box is skipped
    ("2 + 3 = 5.", "5"),  # no box: the last number
    ("She has 1,234 apples", "1234"),
    ("half is 1/2", "1/2"),
    ("the value is -3", "-3"),
    ("10-3", "3"),  # a '-' after a digit is subtraction, not a sign
    ("we get \\frac{3}{4}", "\\frac{3}{4}"),
    ("no digits here", None),
])
def test_extract_final_answer(text, expected):
    assert extract_final_answer(text) == expected


def test_gold_text_handles_gsm8k_and_latex():
    assert gold_text("Natalia sold 48+24 = <<48+24=72>>72 clips.\n#### 72") == "$72$"
    assert gold_text("#### 1,234") == "$1234$"
    assert gold_text("\\frac{1}{2}") == "$\\frac{1}{2}$"
    assert gold_text("$x^2$") == "$x^2$"  # already delimited: unchanged


@pytest.mark.parametrize("response, answer, expected", [
    ("The answer is \\boxed{72}.", "72", (1.0, "correct")),
    ("The answer is \\boxed{71}.", "72", (0.0, "wrong")),
    ("48 + 24 = 72", "Natalia sold 48+24 = <<48+24=72>>72 clips.\n#### 72", (1.0, "correct")),
    ("\\boxed{0.5}", "\\frac{1}{2}", (1.0, "correct")),
    ("\\boxed{\\frac{1}{2}}", "0.5", (1.0, "correct")),
    ("\\boxed{\\dfrac{2}{4}}", "\\frac{1}{2}", (1.0, "correct")),
    ("\\boxed{x = 5}", "5", (1.0, "correct")),
    ("\\boxed{(3, \\frac{\\pi}{2})}", "\\left( 3, \\frac{\\pi}{2} \\right)", (1.0, "correct")),
    ("\\boxed{(3, \\pi)}", "\\left( 3, \\frac{\\pi}{2} \\right)", (0.0, "wrong")),
    ("I do not know.", "5", (0.0, "no_answer")),
    ("import os; os.system('echo hacked') \\boxed{__import__('os')}", "5", (0.0, "wrong")),
])
def test_grade(response, answer, expected):
    assert grade(response, answer) == expected


def test_grade_require_think_grades_only_after_the_block():
    assert grade("\\boxed{5}", "5", require_think=True) == (0.0, "no_think")
    assert grade("<think>maybe \\boxed{5}</think> so \\boxed{6}", "5", require_think=True) == (0.0, "wrong")
    assert grade("<think>2+3</think> \\boxed{5}", "5", require_think=True) == (1.0, "correct")
    assert grade("<think>2+3</think> \\boxed{5}", "5") == (1.0, "correct")  # off by default


def test_grade_reports_unparseable_gold_as_error():
    assert grade("\\boxed{5}", "\\") == (0.0, "error")


@pytest.fixture(scope="module")
def hooked_verifier():
    """One pool for the module (start-up is paid once), with the `_test_sleep` hook enabled."""
    mp = pytest.MonkeyPatch()
    mp.setenv(TEST_HOOKS_ENV, "1")
    with MathVerifier(timeout_s=1.0, workers=2) as verifier:
        mp.undo()
        yield verifier


def test_verifier_matches_grade(hooked_verifier):
    responses = ["\\boxed{5}", "2+2 = 4", "no idea", "\\boxed{\\frac{1}{2}}", "\\boxed{9}"]
    answers = ["5", "#### 4", "3", "0.5", "8"]
    assert hooked_verifier.verify(responses, answers) == [grade(r, a) for r, a in zip(responses, answers)]
    assert hooked_verifier.verify([], []) == []


def test_verifier_timeout_kills_hung_item_and_pool_keeps_working(hooked_verifier):
    before = hooked_verifier.timeouts
    responses = ["\\boxed{1}", "_test_sleep(60) \\boxed{2}", "\\boxed{3}", "\\boxed{4}", "\\boxed{5}", "\\boxed{7}"]
    start = time.monotonic()
    out = hooked_verifier.verify(responses, ["1", "2", "3", "4", "5", "6"])
    elapsed = time.monotonic() - start
    # The hung item scores 0 as "timeout"; the items queued behind it on the same worker are still graded.
    assert out == [(1.0, "correct"), (0.0, "timeout"), (1.0, "correct"),
                   (1.0, "correct"), (1.0, "correct"), (0.0, "wrong")]
    assert elapsed < 30, "the hung worker must be killed, not waited for"
    assert hooked_verifier.timeouts == before + 1
    assert hooked_verifier.verify(["\\boxed{5}"] * 3, ["5", "6", "5"]) == [
        (1.0, "correct"), (0.0, "wrong"), (1.0, "correct")]


def test_verifier_ignores_sleep_marker_without_env(monkeypatch):
    monkeypatch.delenv(TEST_HOOKS_ENV, raising=False)
    with MathVerifier(timeout_s=1.0) as verifier:
        assert verifier.verify(["_test_sleep(60) \\boxed{2}"], ["2"]) == [(1.0, "correct")]
        assert verifier.timeouts == 0
    with pytest.raises(RuntimeError, match="closed"):
        verifier.verify(["1"], ["1"])


def test_verifier_rejects_bad_arguments(hooked_verifier):
    with pytest.raises(ValueError, match="2 responses but 1 answers"):
        hooked_verifier.verify(["1", "2"], ["1"])
    with pytest.raises(ValueError, match="timeout_s > 0"):
        MathVerifier(timeout_s=0)


def test_reasons_are_declared():
    assert {"correct", "wrong", "no_answer", "ambiguous", "no_think", "timeout", "error"} == set(REASONS)
