"""What the verifier saw, per graded response: the extracted prediction, the gold as the grader read
it, the grader's name and version (docs/verifier_audit.md).

`grade_and_describe` is the training loop's grading: each row goes to its grader (`grading.grade_rows`:
math-verify, or the final choice letter for multiple-choice rows, as in evaluation) and comes back
with these audit fields, which the experience store keeps per trajectory. `exgrpo reverify` grades
stored trajectories again with the same function and reports where the stored reward disagrees.
"""

from __future__ import annotations

import functools
from importlib import metadata

from exgrpo_core.reward import grading
from exgrpo_core.types import Question, Rollout

GRADER_CHOICES = ("auto",) + grading.GRADERS
"""`--verifier` of `exgrpo reverify`: auto (each row's own grader) or one grader for every row."""


@functools.lru_cache(maxsize=None)
def version(grader: str) -> str:
    """The grader's version: our rules' version, plus math-verify's for the math grader.

    Example: "math" -> "rules-1+math-verify-0.9.0"; "choice" -> "rules-1".
    """
    if grader not in grading.GRADERS:
        raise ValueError(f"unknown grader {grader!r}; use one of {grading.GRADERS}")
    base = f"rules-{grading.RULES_VERSION}"
    if grader == "choice":
        return base
    try:
        return f"{base}+math-verify-{metadata.version('math-verify')}"
    except metadata.PackageNotFoundError:
        return f"{base}+math-verify-unknown"


def describe(response: str, answer: str, grader: str, require_think: bool = False) -> tuple[str | None, str]:
    """(prediction, gold) as `grader` reads them: math: `grading.extract_final_answer` and the LaTeX
    `grading.gold_text` given to math-verify; choice: `grading.extract_choice` and the gold label.
    Regular expressions only (no sympy, no model output executed); prediction None when none is found."""
    if require_think:
        think = grading._THINK.search(response)
        if think is None:
            return None, _gold(answer, grader)
        response = response[think.end():]
    if grader == "choice":
        gold = _gold(answer, grader)
        return grading.extract_choice(response, digits=gold.isdigit())[0], gold
    return grading.extract_final_answer(response), _gold(answer, grader)


def _gold(answer: str, grader: str) -> str:
    return answer.strip().strip("()[]. ").upper() if grader == "choice" else grading.gold_text(answer)


def grade_and_describe(verify, rollouts: list[Rollout], questions: list[Question], *, require_think: bool = False,
                       grader: str = "auto") -> None:
    """Grade each rollout against its question with its grader (`grader`: auto = `grading.grader_for`
    of the question; or "math" / "choice" for every row) and write reward, reason and the audit fields
    into the records. `verify` is the math verifier ((responses, answers) -> [(reward, reason)])."""
    if grader not in GRADER_CHOICES:
        raise ValueError(f"unknown grader {grader!r}; use one of {GRADER_CHOICES}")
    graders = [grading.grader_for(q.source, q.reward_style) if grader == "auto" else grader for q in questions]
    results = grading.grade_rows(verify, [r.text for r in rollouts], [q.answer for q in questions], graders,
                                 require_think=require_think)
    for r, q, g, (reward, reason) in zip(rollouts, questions, graders, results):
        r.reward, r.reason = float(reward), reason
        r.prediction, r.gold = describe(r.text, q.answer, g, require_think)
        r.verifier, r.verifier_version = g, version(g)


def apply_truncation_rule(rollouts: list[Rollout], rule: str) -> int:
    """`reward.truncated`: grade (the authors: a response cut at the length limit is graded like any
    other) or zero (it scores 0, reason `truncated`, so it is never collected or replayed without its
    EOS). Returns how many truncated responses the grader rewarded (before zeroing)."""
    if rule not in ("grade", "zero"):
        raise ValueError(f"unknown reward.truncated rule {rule!r}; choose grade or zero")
    hit = [r for r in rollouts if r.truncated and r.reward > 0]
    if rule == "zero":
        for r in hit:
            r.reward, r.reason = 0.0, "truncated"
    return len(hit)
