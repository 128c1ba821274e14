"""Two reward functions that run on CPU, installed by name (docs/rewards.md): `reward.fn=exact_match`
(binary: exact match, or a regular expression of the row's) and `reward.fn=arith_format` (continuous:
correctness, format and brevity on the arithmetic task). Each is what a user's own reward looks like.
"""

from __future__ import annotations

import re

from exgrpo_core.reward.grading import _BOX, _braced, extract_final_answer

_SPACE = re.compile(r"\s+")


def final_text(response: str) -> str:
    """The response's final answer as text: the last `\\boxed{...}`, else its last non-empty line.

    Example: "so \\boxed{Paris}." -> "Paris"; "Thinking...\\nParis." -> "Paris".
    """
    for match in reversed(list(_BOX.finditer(response))):
        content = _braced(response, match.end())
        if content and content.strip():
            return content.strip()
    lines = [line for line in response.strip().splitlines() if line.strip()]
    return lines[-1].strip().strip("*_`$ .") if lines else ""


def exact_match(row: dict, response: str) -> tuple[float, str]:
    """1 when the final answer equals the gold (case and spacing ignored), or fully matches the row's
    `pattern` regular expression when it has one; else 0.

    Example: row {"answer": "Paris"}, "The capital is \\boxed{paris}" -> (1.0, "match").
    """
    got = _SPACE.sub(" ", final_text(response)).strip()
    if row.get("pattern"):
        ok = re.fullmatch(str(row["pattern"]), got, flags=re.IGNORECASE) is not None
    else:
        ok = got.casefold() == _SPACE.sub(" ", str(row["answer"])).strip().casefold()
    return (1.0, "match") if ok else (0.0, "no_match")


def arith_format(row: dict, response: str) -> dict:
    """A continuous reward for the arithmetic task: 0.7 for the right number, 0.2 for giving it in
    `\\boxed{}`, 0.1 x max(0, 1 - words / 100) for brevity; in [0, 1].

    Example: row {"answer": "12"}, "3*4 = \\boxed{12}" -> reward 0.7 + 0.2 + 0.1 x 0.97 = 0.997.
    """
    predicted = extract_final_answer(response)
    try:
        right = predicted is not None and abs(float(predicted) - float(str(row["answer"]).strip())) < 1e-9
    except ValueError:
        right = False
    boxed = _BOX.search(response) is not None
    brevity = max(0.0, 1.0 - len(response.split()) / 100)
    reward = 0.7 * right + 0.2 * boxed + 0.1 * brevity
    return {"reward": round(reward, 6), "reason": ("right" if right else "wrong") + ("+boxed" if boxed else "")}
