"""Calibrate the CPU demo: SmolLM2-135M-Instruct's starting accuracy on a bundled set, per difficulty.

Samples K responses per question at the demo's sampling settings with transformers `generate` on CPU
(batched: B questions x K samples per call, as the trainer's rollout does), grades them with the
real MathVerifier, and prints accuracy per `category`, the spread of k = correct-of-K, response
length, truncation and seconds per generate call. Writes benchmarks/results/calibrate_cpu_demo.json.

Committed results (benchmarks/results/), each JSON records its own command:
    calibrate_cpu_demo.json         --questions-per-category 16 --samples 8 --max-new-tokens 64 --temperature 0.7
    calibrate_cpu_demo_t1.json      the same at --temperature 1.0 (8 per category)
    calibrate_cpu_demo_k4.json      --samples 4 --temperature 0.7 (8 per category)
    calibrate_cpu_demo_gsm8k.json   --dataset gsm8k-easy --max-new-tokens 160 with the \\boxed instruction
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from benchmarks.bench_record import write_json  # noqa: E402
from exgrpo_core.data.questions import BUNDLED_DIR, load_questions, prompt_token_ids  # noqa: E402
from exgrpo_core.models.load import load_policy  # noqa: E402
from exgrpo_core.reward.grading import MathVerifier  # noqa: E402

DEFAULT_INSTRUCTION = "Answer with just the final number."


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="arith-easy", help="bundled dataset name (rows carry a `category`)")
    p.add_argument("--instruction", default=DEFAULT_INSTRUCTION)
    p.add_argument("--questions-per-category", type=int, default=8)
    p.add_argument("--samples", type=int, default=8, help="K responses per question")
    p.add_argument("--batch-questions", type=int, default=8, help="questions per generate call")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/calibrate_cpu_demo.json")
    return p.parse_args()


def pick_questions(dataset: str, instruction: str, per_category: int):
    """The first `per_category` questions of each category, interleaved (batches mix difficulties)."""
    rows = [json.loads(line) for line in (BUNDLED_DIR / f"{dataset}.jsonl").read_text().splitlines()]
    category = {r["id"]: r.get("category", "all") for r in rows}
    by_cat: dict[str, list] = defaultdict(list)
    for q in load_questions(f"bundled:{dataset}", instruction=instruction):
        if len(by_cat[category[q.uid]]) < per_category:
            by_cat[category[q.uid]].append(q)
    picked = [q for group in zip(*by_cat.values()) for q in group]
    return picked, category


def weighted_accuracy(table: dict, category: dict[str, str]) -> float:
    """Accuracy over the whole dataset: per-category accuracy weighted by the category's share of rows."""
    counts = defaultdict(int)
    for cat in category.values():
        counts[cat] += 1
    total = sum(counts[c] for c in table)
    return sum(s["accuracy"] * counts[c] / total for c, s in table.items())


@torch.no_grad()
def sample(model, tokenizer, prompts: list[list[int]], k: int, args) -> tuple[list[list[int]], float]:
    """K samples per prompt in one left-padded generate call; returns response ids and seconds."""
    flat = [p for p in prompts for _ in range(k)]
    width = max(len(p) for p in flat)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in flat])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in flat])
    start = time.perf_counter()
    out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=args.temperature,
                         top_p=args.top_p, top_k=0, max_new_tokens=args.max_new_tokens, pad_token_id=pad)
    seconds = time.perf_counter() - start
    responses = []
    for row in out[:, width:].tolist():
        if tokenizer.eos_token_id in row:
            row = row[:row.index(tokenizer.eos_token_id) + 1]
        responses.append(row)
    return responses, seconds


def summarise(records: list[dict], k: int) -> dict:
    n = len(records)
    ks = [r["k"] for r in records]
    return {
        "questions": n,
        "accuracy": sum(ks) / (n * k),
        "k_histogram": [ks.count(i) for i in range(k + 1)],
        "mixed_fraction": sum(0 < x < k for x in ks) / n,
        "mean_response_tokens": statistics.mean(t for r in records for t in r["lengths"]),
        "truncation_rate": statistics.mean(t for r in records for t in r["truncated"]),
    }


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model, tokenizer = load_policy("smollm2-135m-instruct")
    model.eval()
    questions, category = pick_questions(args.dataset, args.instruction, args.questions_per_category)
    K, B = args.samples, args.batch_questions
    records, seconds, example = [], [], None
    with MathVerifier(timeout_s=5.0) as verifier:
        for i in range(0, len(questions), B):
            batch = questions[i:i + B]
            prompts = [prompt_token_ids(tokenizer, q, 1024) for q in batch]
            responses, dt = sample(model, tokenizer, prompts, K, args)
            seconds.append(dt)
            texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
            graded = verifier.verify(texts, [q.answer for q in batch for _ in range(K)])
            example = example or {"prompt": tokenizer.decode(prompts[0]), "response": texts[0]}
            for j, q in enumerate(batch):
                rows = range(j * K, (j + 1) * K)
                records.append({"uid": q.uid, "category": category[q.uid], "k": int(sum(graded[r][0] for r in rows)),
                                "lengths": [len(responses[r]) for r in rows],
                                "truncated": [responses[r][-1] != tokenizer.eos_token_id for r in rows]})
            print(f"batch {i // B + 1}: {len(batch)} questions x {K} samples in {dt:.1f} s", flush=True)
    by_cat = defaultdict(list)
    for r in records:
        by_cat[r["category"]].append(r)
    table = {cat: summarise(rs, K) for cat, rs in sorted(by_cat.items())}
    overall = summarise(records, K)
    overall["dataset_weighted_accuracy"] = weighted_accuracy(table, category)
    print(f"\n{'category':10} {'n':>4} {'acc':>6} {'mixed':>6} {'len':>6} {'trunc':>6}  k histogram 0..{K}")
    for cat, s in [*table.items(), ("ALL", overall)]:
        print(f"{cat:10} {s['questions']:4d} {s['accuracy']:6.2f} {s['mixed_fraction']:6.2f} "
              f"{s['mean_response_tokens']:6.1f} {s['truncation_rate']:6.2f}  {s['k_histogram']}")
    print(f"accuracy weighted by the dataset's category mix: {overall['dataset_weighted_accuracy']:.2f}")
    print(f"generate: {statistics.mean(seconds):.1f} s per call of {B} x {K} sequences "
          f"(min {min(seconds):.1f}, max {max(seconds):.1f}; CPU shared, expect noise)")
    write_json(args.out, {
        "command": "python " + " ".join(sys.argv),
        "settings": {k: (_relative(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": {"cpu_threads": torch.get_num_threads(), "python": platform.python_version(),
                    "torch": torch.__version__},
        "per_category": table, "overall": overall,
        "seconds_per_generate": {"mean": statistics.mean(seconds), "min": min(seconds), "max": max(seconds),
                                 "calls": len(seconds)},
        "example": example, "questions": records}, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
