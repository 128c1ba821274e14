"""Multiple-choice grading (the OOD suite: ARC-c, GPQA-Diamond, MMLU-Pro): the final choice letter.

Run: .venv/bin/python -m pytest tests/exgrpo_core/reward/test_rewards_choice.py -q
"""

import builtins

import pytest

from exgrpo_core.reward.grading import extract_choice, grade, grade_choice, grade_rows, grader_for

# Responses written the way the policy writes them under the authors' system prompt (think, then solve).
QWEN_BOXED = """<think>
The planet spins faster after the impact, so one rotation takes less time. Density depends on mass and
volume (A is unrelated), the year depends on the orbit (B is wrong), gravity depends on mass (D is wrong).
</think>
A faster rotation means each day is shorter.

The answer is \\boxed{C}."""
GPQA_STYLE = """Lifetimes of 1e-9 s and 1e-8 s give energy widths of about 6.6e-7 eV and 6.6e-8 eV.
To resolve the levels the difference must exceed the larger width, so only 1e-4 eV works.

ANSWER: A"""
SELF_CORRECTED = """Option B looks right at first: the answer is (B).
Wait, the reagent adds one carbon in the last step, not in the first, so I was wrong.
Counting again gives 11 carbons.

ANSWER: D"""
HEDGED = """Both the second and the fourth statements fit the data equally well.

ANSWER: B or D"""
TWO_BOXES = "It is either \\boxed{A} or \\boxed{C}; I cannot tell."
ARC_DIGITS = "Kinetic energy grows as the sled speeds up while potential energy falls.\n\nThe answer is (2)."
RAMBLING = "Apparently the question is about density. Buildings are made safer by testing, as a rule."


@pytest.mark.parametrize("response, gold, expected", [
    (QWEN_BOXED, "C", (1.0, "correct")),
    (QWEN_BOXED, "D", (0.0, "wrong")),  # the letters named while ruling options out are not the answer
    (GPQA_STYLE, "A", (1.0, "correct")),
    (GPQA_STYLE, "B", (0.0, "wrong")),
    (SELF_CORRECTED, "D", (1.0, "correct")),  # the last announcement decides
    (SELF_CORRECTED, "B", (0.0, "wrong")),
    (HEDGED, "B", (0.0, "ambiguous")),  # two different letters announced: no credit for either
    (HEDGED, "D", (0.0, "ambiguous")),
    (TWO_BOXES, "A", (0.0, "ambiguous")),
    (ARC_DIGITS, "2", (1.0, "correct")),  # ARC-c questions with options 1) .. 4) have a digit gold
    (ARC_DIGITS, "3", (0.0, "wrong")),
    (RAMBLING, "A", (0.0, "no_answer")),  # the "A" of "Apparently" is inside a word
    ("", "A", (0.0, "no_answer")),
    (GPQA_STYLE, "the first one", (0.0, "error")),  # a gold that is no label is a data problem
])
def test_grade_choice_on_real_looking_responses(response, gold, expected):
    assert grade_choice(response, gold) == expected


@pytest.mark.parametrize("text, expected", [
    ("ANSWER: C", "C"),
    ("**Answer:** (B)", "B"),
    ("Final answer: B.", "B"),
    ("The correct answer is option D because the others contradict the data.", "D"),
    ("So the answer is (B).", "B"),
    ("So the answer is B.", "B"),  # "(B)" and "B." are the same choice
    ("The answer is: **C) Planetary days will become shorter.**", "C"),
    ("\\boxed{\\text{(A) buildings will be built faster}}", "A"),
    ("The final answer is $\\boxed{D}$.", "D"),
    ("Therefore option C is correct.", "C"),
    ("Answer:\nB", "B"),  # the letter on the next line
    ("answer: c", "C"),  # lowercase where it cannot be an article
    ("the answer is (d)", "D"),
    ("\\boxed{b}", "B"),
    ("I compared the four options.\n\n**B**", "B"),  # a bare final letter
    ("Only one fits.\n(A).", "A"),
])
def test_extract_choice_accepts_the_announcement_formats(text, expected):
    assert extract_choice(text) == (expected, "ok")


@pytest.mark.parametrize("text, reason", [
    ("the answer is a mixture of salt and water", "no_answer"),  # lowercase article, not option a
    ("Answer: I think the second option", "no_answer"),  # the pronoun I, not option I
    ("The answer is not obvious; Evaluating each choice in turn.", "no_answer"),
    ("ANSWER: $LETTER", "no_answer"),  # the instruction echoed back
    ("Let me check each option:\nA) density\nB) years", "no_answer"),  # a list of options announces nothing
    ("Option A is incorrect and option B is incorrect.", "no_answer"),
    ("ANSWER: A, C", "ambiguous"),
    ("The answer is A and B.", "ambiguous"),
    ("\\boxed{AC}", "ambiguous"),
    ("\\boxed{A} or \\boxed{B}", "ambiguous"),
    ("The answer is (B), that is \\boxed{B}.", "ok"),  # one line naming the same letter twice
    ("the answer is (A)\nANSWER: B", "ok"),  # a correction on a later line is no ambiguity
])
def test_extract_choice_refuses_words_articles_and_two_letters(text, reason):
    assert extract_choice(text)[1] == reason


def test_digit_labels_only_count_for_digit_golds_and_never_inside_numbers():
    assert extract_choice("ANSWER: 3", digits=True) == ("3", "ok")
    assert extract_choice("\\boxed{3}", digits=True) == ("3", "ok")
    assert extract_choice("ANSWER: 3") == (None, "no_answer")  # letter questions: a number is no choice
    assert extract_choice("ANSWER: C", digits=True) == (None, "no_answer")
    assert extract_choice("the answer is 25 joules", digits=True) == (None, "no_answer")
    assert extract_choice("the answer is 2.5 joules", digits=True) == (None, "no_answer")


def test_require_think_reads_only_after_the_think_block():
    assert grade_choice(GPQA_STYLE, "A", require_think=True) == (0.0, "no_think")
    assert grade_choice(QWEN_BOXED, "C", require_think=True) == (1.0, "correct")
    thought_only = "<think>ANSWER: C</think>\nI am not sure."
    assert grade_choice(thought_only, "C") == (1.0, "correct")
    assert grade_choice(thought_only, "C", require_think=True) == (0.0, "no_answer")


def test_gold_written_in_parentheses_or_lowercase_is_the_same_label():
    assert grade_choice("ANSWER: B", "(B)") == (1.0, "correct")
    assert grade_choice("ANSWER: B", " b ") == (1.0, "correct")


def test_math_verify_alone_would_miss_a_gpqa_answer():
    """Why the OOD rows need their own grader: the GPQA format names no number or box."""
    assert grade(GPQA_STYLE, "A")[0] == 0.0
    assert grade_choice(GPQA_STYLE, "A") == (1.0, "correct")


def test_grader_is_chosen_per_row_by_data_source_or_reward_style():
    assert grader_for("arc_c") == grader_for("gpqa") == grader_for("mmlu_pro") == "choice"
    assert grader_for("arc_c", "rule") == "choice"  # verl's generic style does not override the source
    assert grader_for("math") == grader_for("aime") == grader_for("gsm8k-test") == "math"
    assert grader_for("my_quiz", "choice") == "choice" and grader_for("arc_c", "math") == "math"


def test_grade_rows_sends_only_math_rows_to_the_math_verifier():
    seen = []

    def fake_math_verify(responses, answers):
        seen.append((list(responses), list(answers)))
        return [(1.0, "correct") if r == "\\boxed{4}" else (0.0, "wrong") for r in responses]

    out = grade_rows(fake_math_verify, ["\\boxed{4}", "ANSWER: C", "\\boxed{5}", "ANSWER: A or B"],
                     ["4", "C", "4", "A"], ["math", "choice", "math", "choice"])
    assert out == [(1.0, "correct"), (1.0, "correct"), (0.0, "wrong"), (0.0, "ambiguous")]
    assert seen == [(["\\boxed{4}", "\\boxed{5}"], ["4", "4"])]  # one call, math rows only, in order
    assert grade_rows(fake_math_verify, ["ANSWER: C"], ["C"], ["choice"]) == [(1.0, "correct")]
    assert len(seen) == 1  # no math rows: the verifier is not called at all
    with pytest.raises(ValueError, match="unknown graders"):
        grade_rows(fake_math_verify, ["x"], ["1"], ["code"])
    with pytest.raises(ValueError, match="1 responses, 2 answers"):
        grade_rows(fake_math_verify, ["x"], ["1", "2"], ["math"])


def test_grading_never_evaluates_the_response(monkeypatch):
    def refuse(*_args, **_kwargs):
        raise AssertionError("model output must never be executed")

    monkeypatch.setattr(builtins, "eval", refuse)
    monkeypatch.setattr(builtins, "exec", refuse)
    monkeypatch.setattr(builtins, "compile", refuse)
    response = "ANSWER: __import__('os').system('touch /tmp/pwned')\nANSWER: B"
    assert grade_choice(response, "B") == (1.0, "correct")


def test_long_adversarial_responses_are_graded_not_hung():
    """Inputs that make naive patterns quadratic: runs of markup, unclosed boxes, endless cues."""
    assert grade_choice("answer: " + "*" * 50_000, "A") == (0.0, "no_answer")
    assert grade_choice("\\boxed{" * 10_000, "A") == (0.0, "no_answer")
    assert grade_choice("the answer is " * 10_000 + "ANSWER: A", "A") == (1.0, "correct")
