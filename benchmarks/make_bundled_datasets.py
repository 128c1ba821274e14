"""Rebuild the bundled question sets in exgrpo_core/datasets/ (deterministic; the output is committed).

    .venv/bin/python benchmarks/make_bundled_datasets.py [--gsm8k ../shared/data/gsm8k]

tiny-arith: every "a+b" with a+b <= 9 plus nine "a-b", for the tiny char-level preset.
arith-easy(-test): mixed-difficulty arithmetic for the CPU demo, 240 train / 80 test (mix from calibrate_cpu_demo.py).
gsm8k-easy(-test): the shortest 1-2 step GSM8K problems (MIT, OpenAI), train from train.jsonl, test from test.jsonl.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "exgrpo_core" / "datasets"

# category -> question maker; ARITH_COUNTS: questions per category (train + test), chosen with
# benchmarks/calibrate_cpu_demo.py so that SmolLM2-135M starts at medium accuracy with mixed groups.
CATEGORIES = {
    "add1": lambda r: _pair(r, "+", (0, 9), (0, 9)),    # 100 distinct
    "sub1": lambda r: _sub(r, (0, 9), (0, 9)),         # 55 distinct (no negatives)
    "mul1": lambda r: _pair(r, "*", (0, 9), (0, 9)),    # 100 distinct
    "add21": lambda r: _pair(r, "+", (10, 99), (1, 9)),
    "sub21": lambda r: _sub(r, (10, 99), (1, 9)),
}
ARITH_COUNTS = {"add1": 90, "sub1": 50, "mul1": 90, "add21": 50, "sub21": 40}
TEST_FRACTION = 0.25
QUESTION_FORMAT = "What is {expr}?"


def _pair(rng: random.Random, op: str, ra: tuple[int, int], rb: tuple[int, int]) -> tuple[str, int]:
    a, b = rng.randint(*ra), rng.randint(*rb)
    return f"{a} {op} {b}", a + b if op == "+" else a * b


def _sub(rng: random.Random, ra: tuple[int, int], rb: tuple[int, int]) -> tuple[str, int]:
    a = rng.randint(*ra)
    b = rng.randint(rb[0], min(rb[1], a))
    return f"{a} - {b}", a - b


def tiny_arith() -> list[dict]:
    """64 single-digit-answer questions the tiny tokenizer covers character by character."""
    rows = [{"question": f"{a}+{b}", "answer": str(a + b)} for a in range(10) for b in range(10 - a)]
    rows += [{"question": f"9-{b}", "answer": str(9 - b)} for b in range(1, 10)]
    return [{"id": f"tiny-arith-{i:02d}", **r} for i, r in enumerate(rows)]


def arith_easy(seed: int = 0, counts: dict[str, int] = ARITH_COUNTS) -> tuple[list[dict], list[dict]]:
    """Distinct arithmetic questions per difficulty category, split per category into train and held-out test."""
    rng = random.Random(seed)
    seen: set[str] = set()
    train, test = [], []
    for cat, count in counts.items():
        rows = []
        while len(rows) < count:
            expr, value = CATEGORIES[cat](rng)
            if expr not in seen:
                seen.add(expr)
                rows.append({"question": QUESTION_FORMAT.format(expr=expr), "answer": str(value), "category": cat})
        n_test = round(TEST_FRACTION * count)
        test += rows[:n_test]
        train += rows[n_test:]
    rng.shuffle(train)
    rng.shuffle(test)
    return ([{"id": f"arith-easy-{i:03d}", **r} for i, r in enumerate(train)],
            [{"id": f"arith-easy-test-{i:03d}", **r} for i, r in enumerate(test)])


def gsm8k_easy(path: Path, n: int, prefix: str) -> list[dict]:
    """The n easiest GSM8K rows: fewest calculator steps, then shortest question; integer answers < 1000."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    picked = []
    for i, row in enumerate(rows):
        final = row["answer"].rsplit("####", 1)[1].strip().replace(",", "")
        steps = row["answer"].count("<<")
        if 1 <= steps <= 2 and final.isdigit() and int(final) < 1000 and len(row["question"]) < 220:
            picked.append((steps, len(row["question"]), i, row, final))
    picked.sort(key=lambda t: t[:3])
    chosen = sorted(picked[:n], key=lambda t: t[2])  # back to file order
    return [{"id": f"{prefix}-{i:03d}", "question": row["question"], "answer": row["answer"],
             "category": f"steps{steps}", "gsm8k_row": index}
            for i, (steps, _, index, row, _) in enumerate(chosen)]


def _write(name: str, rows: list[dict]) -> None:
    with open(OUT / f"{name}.jsonl", "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {OUT / name}.jsonl ({len(rows)} rows)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gsm8k", type=Path, default=Path(__file__).resolve().parents[2] / "shared/data/gsm8k")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    _write("tiny-arith", tiny_arith())
    train, test = arith_easy()
    _write("arith-easy", train)
    _write("arith-easy-test", test)
    _write("gsm8k-easy", gsm8k_easy(args.gsm8k / "train.jsonl", 300, "gsm8k-easy"))
    _write("gsm8k-easy-test", gsm8k_easy(args.gsm8k / "test.jsonl", 100, "gsm8k-easy-test"))


if __name__ == "__main__":
    main()
