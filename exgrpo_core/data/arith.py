"""A generated task for fast learning benchmarks: two-digit addition and subtraction with short worked
answers (`gen:arith-<split>` datasets; issue 15).

Every question "47+38=?" has several distinct correct worked trajectories, for example
"47+30=77 77+8=85", "38+40=78 78+7=85" and "40+30=70 7+8=15 70+15=85": the answer is multi-token and
the final number is what the verifier grades (rewards.extract_final_answer takes the last number).
All (op, a, b) with 10 <= a, b <= 99 (a >= b for subtraction) are shuffled once with a fixed seed
and cut into three disjoint splits: `test` (held-out evaluation), `train` (RL questions) and `sft`
(the rest: the supervised warm start, exgrpo_core/models/warm_start.py, never sees a train or test pair).
"""

from __future__ import annotations

import random

SPLIT_SEED = 15
SPLIT_SIZES = {"test": 256, "train": 512}  # `sft` takes every remaining pair
SPLITS = ("sft", "train", "test")


def all_problems() -> list[tuple[str, int, int]]:
    """Every (op, a, b): op '+' or '-', two-digit operands, non-negative differences; a fixed order."""
    out = [("+", a, b) for a in range(10, 100) for b in range(10, 100)]
    return out + [("-", a, b) for a in range(10, 100) for b in range(10, a + 1)]


def split(name: str) -> list[tuple[str, int, int]]:
    """The problems of one split (`sft`, `train`, `test`), disjoint, in a fixed shuffled order."""
    if name not in SPLITS:
        raise ValueError(f"unknown arith split {name!r}; choose from {', '.join(SPLITS)}")
    problems = all_problems()
    random.Random(SPLIT_SEED).shuffle(problems)
    n_test, n_train = SPLIT_SIZES["test"], SPLIT_SIZES["train"]
    bounds = {"test": (0, n_test), "train": (n_test, n_test + n_train), "sft": (n_test + n_train, len(problems))}
    lo, hi = bounds[name]
    return problems[lo:hi]


def result(op: str, a: int, b: int) -> int:
    return a + b if op == "+" else a - b


def question_text(op: str, a: int, b: int) -> str:
    return f"{a}{op}{b}=?"


def solutions(op: str, a: int, b: int) -> list[str]:
    """Distinct correct worked answers, steps separated by spaces, ending with the result."""
    r, (a1, a0), (b1, b0) = result(op, a, b), divmod(a, 10), divmod(b, 10)
    if op == "+":
        forms = [f"{a}+{10 * b1}={a + 10 * b1} {a + 10 * b1}+{b0}={r}",
                 f"{b}+{10 * a1}={b + 10 * a1} {b + 10 * a1}+{a0}={r}",
                 f"{10 * a1}+{10 * b1}={10 * (a1 + b1)} {a0}+{b0}={a0 + b0} {10 * (a1 + b1)}+{a0 + b0}={r}"]
    else:
        forms = [f"{a}-{10 * b1}={a - 10 * b1} {a - 10 * b1}-{b0}={r}",
                 f"{a}-{b0}={a - b0} {a - b0}-{10 * b1}={r}"]
        if b0:  # round b up to the next ten, then add back
            up = 10 * (b1 + 1)
            forms.append(f"{a}-{up}={a - up} {a - up}+{up - b}={r}")
    return list(dict.fromkeys(forms))


def rows(name: str) -> list[dict]:
    """JSON-like rows of split `name` for data.load_questions: id, question, answer, data_source."""
    return [{"id": f"arith-{'add' if op == '+' else 'sub'}-{a}-{b}", "question": question_text(op, a, b),
             "answer": str(result(op, a, b)), "data_source": f"arith-{name}"} for op, a, b in split(name)]
