"""A generated task where replay's question selection has room to act: three-digit addition and subtraction
with worked answers (`gen:arith3-<split>`), 2,048 RL questions and 256 held-out ones.

Every question "347+285=?" has several correct worked trajectories, each three place-value steps
("347+200=547 547+80=627 627+5=632", the same from 285, or hundreds/tens/units then their sum). The
splits are disjoint draws from all (op, a, b) with 100 <= a, b <= 999 (a >= b for subtraction), by a
fixed seed: `test`, `train`, and `sft` (20,000 more, the supervised warm start's, never a train or
test pair). Beside `arith` (two-digit, 512 questions) it has four times the questions and harder
ones, so the medium buckets stay filled at learning rates where `arith`'s run dry.
"""

from __future__ import annotations

import functools
import random

SPLIT_SEED = 46
SPLIT_SIZES = {"test": 256, "train": 2048, "sft": 20000}
SPLITS = ("sft", "train", "test")


@functools.lru_cache(maxsize=1)
def _draws() -> dict[str, list[tuple[str, int, int]]]:
    rng = random.Random(SPLIT_SEED)
    seen: set[tuple[str, int, int]] = set()
    out: dict[str, list[tuple[str, int, int]]] = {}
    for name in ("test", "train", "sft"):  # test first: its questions never depend on the other sizes
        part = []
        while len(part) < SPLIT_SIZES[name]:
            op, a, b = rng.choice("+-"), rng.randint(100, 999), rng.randint(100, 999)
            if op == "-" and a < b:
                a, b = b, a
            if (op, a, b) not in seen:
                seen.add((op, a, b))
                part.append((op, a, b))
        out[name] = part
    return out


def split(name: str) -> list[tuple[str, int, int]]:
    """The problems of one split (`sft`, `train`, `test`): disjoint, in a fixed order."""
    if name not in SPLITS:
        raise ValueError(f"unknown arith3 split {name!r}; choose from {', '.join(SPLITS)}")
    return list(_draws()[name])


def result(op: str, a: int, b: int) -> int:
    return a + b if op == "+" else a - b


def question_text(op: str, a: int, b: int) -> str:
    return f"{a}{op}{b}=?"


def solutions(op: str, a: int, b: int) -> list[str]:
    """Distinct correct worked answers (three steps, space separated), each ending with the result.

    Example: ("+", 347, 285) -> "347+200=547 547+80=627 627+5=632", "285+300=585 585+40=625 625+7=632",
    "300+200=500 47+85=132 500+132=632".
    """
    r = result(op, a, b)
    bh, bt, bu = 100 * (b // 100), 10 * (b // 10 % 10), b % 10
    if op == "+":
        ah, rest_a = 100 * (a // 100), a % 100
        at, au = 10 * (a // 10 % 10), a % 10
        forms = [f"{a}+{bh}={a + bh} {a + bh}+{bt}={a + bh + bt} {a + bh + bt}+{bu}={r}",
                 f"{b}+{ah}={b + ah} {b + ah}+{at}={b + ah + at} {b + ah + at}+{au}={r}",
                 f"{ah}+{bh}={ah + bh} {rest_a}+{b % 100}={rest_a + b % 100} {ah + bh}+{rest_a + b % 100}={r}"]
    else:
        forms = [f"{a}-{bh}={a - bh} {a - bh}-{bt}={a - bh - bt} {a - bh - bt}-{bu}={r}",
                 f"{a}-{bu}={a - bu} {a - bu}-{bt}={a - bu - bt} {a - bu - bt}-{bh}={r}"]
    return list(dict.fromkeys(forms))


def rows(name: str) -> list[dict]:
    """JSON-like rows of split `name` for data.load_questions: id, question, answer, data_source."""
    return [{"id": f"arith3-{'add' if op == '+' else 'sub'}-{a}-{b}", "question": question_text(op, a, b),
             "answer": str(result(op, a, b)), "data_source": f"arith3-{name}"} for op, a, b in split(name)]
