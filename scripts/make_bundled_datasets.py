"""Rebuild the bundled question sets in exgrpo_core/data/datasets/ (deterministic; the output is committed).

    .venv/bin/python scripts/make_bundled_datasets.py [--gsm8k ../shared/data/gsm8k]

tiny-arith: every "a+b" with a+b <= 9 plus nine "a-b", for the tiny char-level preset.
tiny-arith-test: every "a-b" with b <= a <= 8, the tiny preset's held-out suite (no question of tiny-arith).
arith-easy(-test): mixed-difficulty arithmetic for the CPU demo, 240 train / 80 test (mix from calibrate_cpu_demo.py).
arith-half(-test): the same 320 questions re-split 160 / 160 per category (the SmolLM2 confirmation's held-out).
gsm8k-easy(-test): the shortest 1-2 step GSM8K problems (MIT, OpenAI), train from train.jsonl, test from test.jsonl.
exgrpo-eval-ood.parquet: the `ood` evaluation suite, the authors' ARC-c and GPQA-Diamond verl rows (--ood folder)
unchanged, in one zstd-compressed file (checked against the sources' sha256 and read back row by row).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "exgrpo_core" / "data" / "datasets"

# category -> question maker; ARITH_COUNTS: questions per category (train + test), chosen with
# benchmarks/learning/calibrate_cpu_demo.py so that SmolLM2-135M starts at medium accuracy with mixed groups.
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


def tiny_arith_test() -> list[dict]:
    """45 held-out questions for the tiny preset: every "a-b" with b <= a <= 8 (tiny-arith has only 9-b)."""
    rows = [{"question": f"{a}-{b}", "answer": str(a - b)} for a in range(9) for b in range(a + 1)]
    return [{"id": f"tiny-arith-test-{i:02d}", **r} for i, r in enumerate(rows)]


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


def arith_easy_half(train: list[dict], test: list[dict], seed: int = 1) -> tuple[list[dict], list[dict]]:
    """arith-easy and arith-easy-test pooled (320 questions) and re-split half / half within each category:
    a held-out set of 160 for the SmolLM2 confirmation, same mix as training."""
    rng = random.Random(seed)
    halves: tuple[list[dict], list[dict]] = ([], [])
    for cat in CATEGORIES:
        rows = [{k: r[k] for k in ("question", "answer", "category")} for r in train + test if r["category"] == cat]
        rng.shuffle(rows)
        halves[0].extend(rows[:len(rows) // 2])
        halves[1].extend(rows[len(rows) // 2:])
    for half in halves:
        rng.shuffle(half)
    return ([{"id": f"arith-half-{i:03d}", **r} for i, r in enumerate(halves[0])],
            [{"id": f"arith-half-test-{i:03d}", **r} for i, r in enumerate(halves[1])])


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


# The authors' OOD files (ExGRPO / LUFFY repository, data/valid.arc_c.parquet and data/valid.gpqa.parquet), in order.
OOD_SOURCES = {
    "arc_c.parquet": "7c3d1df8f11ade8be258ee0b0c7bbd6ac9a8e535dee3dbb3b5410f974f0d8fe5",
    "gpqa_diamond.parquet": "55bde3943eeb6906d6d569d0ab882638c2f395a716ab5fa1fa20a186e722e58b",
}
OOD_FILE = "exgrpo-eval-ood.parquet"


def ood_suite(folder: Path) -> None:
    """Concatenate the OOD files' rows unchanged into OUT/OOD_FILE (zstd; the pandas index metadata dropped)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = []
    for name, sha256 in OOD_SOURCES.items():
        digest = hashlib.sha256((folder / name).read_bytes()).hexdigest()
        if digest != sha256:
            raise SystemExit(f"{folder / name}: sha256 {digest} is not the authors' file ({sha256})")
        tables.append(pq.read_table(folder / name))
    table = pa.concat_tables(tables).replace_schema_metadata(None)
    pq.write_table(table, OUT / OOD_FILE, compression="zstd", compression_level=19)
    if pq.read_table(OUT / OOD_FILE).to_pylist() != [r for t in tables for r in t.to_pylist()]:
        raise SystemExit(f"{OUT / OOD_FILE}: rows read back differ from the sources")
    print(f"wrote {OUT / OOD_FILE} ({table.num_rows} rows)")


def _write(name: str, rows: list[dict]) -> None:
    with open(OUT / f"{name}.jsonl", "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {OUT / name}.jsonl ({len(rows)} rows)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gsm8k", type=Path, default=ROOT.parent / "shared/data/gsm8k")
    parser.add_argument("--ood", type=Path, default=ROOT.parent / "shared/data/ood",
                        help="folder with the authors' arc_c.parquet and gpqa_diamond.parquet")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    _write("tiny-arith", tiny_arith())
    _write("tiny-arith-test", tiny_arith_test())
    train, test = arith_easy()
    _write("arith-easy", train)
    _write("arith-easy-test", test)
    half, half_test = arith_easy_half(train, test)
    _write("arith-half", half)
    _write("arith-half-test", half_test)
    _write("gsm8k-easy", gsm8k_easy(args.gsm8k / "train.jsonl", 300, "gsm8k-easy"))
    _write("gsm8k-easy-test", gsm8k_easy(args.gsm8k / "test.jsonl", 100, "gsm8k-easy-test"))
    ood_suite(args.ood)


if __name__ == "__main__":
    main()
