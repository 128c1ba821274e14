"""Benchmark evaluation (paper §4): sample, grade, score pass@1 as avg@k, ID / OOD averages.

Suites (`suites.py`): any dataset `data.load_questions` reads, the shipped names in `SUITES` and the
hub names in `HUB_SUITES`. Each row's source (verl `data_source`) is a benchmark, graded by
math-verify or, for multiple choice (ARC-c, GPQA, MMLU-Pro), by its final choice letter. Rows that
repeat one question (the paper's parquet holds AIME/AMC 32 times: avg@32) become one question
sampled `repeats * samples` times, so pass@1 = mean over questions of c_i / n_i, and pass@k uses the
unbiased estimator; the ID and OOD averages are over the benchmarks `suites.BENCHMARKS` puts there. Generation goes
through the rollout engine under a forked, seeded RNG, so evaluating inside training neither
changes the training run's random stream nor depends on it. Tables and plots live in `eval_report`.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import torch

from exgrpo_core.data import questions as data
from exgrpo_core.reward import grading as rewards
from exgrpo_core.evaluation.suites import (  # noqa: F401 - the suite API, re-exported
    BENCHMARKS, GROUPS, SUITES, EvalItem, benchmark_name, group_of, group_repeats, load_suite, resolve_suite)
from exgrpo_core.rollout.engine import TransformersEngine

AVERAGE = "average"
GROUP_AVERAGES = {group: f"{group}_average" for group in GROUPS}
"""The declared groups' averages (Table 1's ID Avg / OOD Avg) under these names in `flat_metrics`."""
Verify = Callable[[list[str], list[str]], list[tuple[float, str]]]


@dataclass
class QuestionResult:
    """The graded samples of one question: n samples, `correct` of them right."""

    uid: str
    benchmark: str
    answer: str
    n: int
    correct: int
    reasons: dict[str, int]
    response_tokens: int
    truncated: int
    example: str = ""
    """The first sampled response (for the samples artifact)."""


@dataclass
class EvalReport:
    """Scores of one evaluation: per benchmark metrics, the unweighted average, per-question results."""

    benchmarks: dict[str, dict[str, float]]
    average: dict[str, float]
    questions: list[QuestionResult] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> dict:
        """{benchmark: {"pass@1": ..., ...}, "average": {"pass@1": ...}} (the train flow's `eval` key)."""
        return {**{b: dict(m) for b, m in self.benchmarks.items()}, AVERAGE: dict(self.average)}

    def group_averages(self) -> dict[str, float]:
        """{"id": mean pass@1 of the ID benchmarks, "ood": ... of the OOD ones}, for groups present."""
        return group_averages({b: m["pass@1"] for b, m in self.benchmarks.items()})


def group_averages(pass1: dict[str, float]) -> dict[str, float]:
    """Unweighted mean per declared group (`suites.BENCHMARKS`) of {benchmark name: pass@1}; absent groups left out.

    Example: {"AIME24": 0.2, "MATH-500": 0.6, "ARC-c": 0.9, "GSM8K": 0.5} -> {"id": 0.4, "ood": 0.9}.
    """
    out = {}
    for group in GROUPS:
        values = [v for b, v in pass1.items() if group_of(b) == group]
        if values:
            out[group] = sum(values) / len(values)
    return out


# ---- scores ---------------------------------------------------------------------------------------
def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021, Eq. 1): 1 - C(n-c, k) / C(n, k), as a stable product.

    Example: n=4, c=1, k=2 -> 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (got n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def avg_at_k(results: list[QuestionResult]) -> float:
    """ExGRPO §4 pass@1 as avg@k: the mean over questions of c_i / n_i (= mean unbiased pass@1)."""
    if not results:
        raise ValueError("avg@k of no questions")
    return sum(r.correct / r.n for r in results) / len(results)


def score_benchmark(results: list[QuestionResult], pass_k: list[int] | tuple[int, ...] = ()) -> dict[str, float]:
    """pass@1 (avg@k), pass@k for each k every question has samples for, and sample diagnostics."""
    n_min = min(r.n for r in results)
    samples = sum(r.n for r in results)
    m = {"pass@1": avg_at_k(results)}
    for k in sorted(set(pass_k)):
        if 1 < k <= n_min:
            m[f"pass@{k}"] = sum(pass_at_k(r.n, r.correct, k) for r in results) / len(results)
    m.update({
        "samples": float(n_min),  # the k of avg@k
        "questions": float(len(results)),
        "response_length": sum(r.response_tokens for r in results) / samples,
        "truncation_rate": sum(r.truncated for r in results) / samples,
        "no_answer_rate": sum(r.reasons.get("no_answer", 0) for r in results) / samples,
        "timeout_rate": sum(r.reasons.get("timeout", 0) for r in results) / samples,
    })
    return m


def score(results: list[QuestionResult], pass_k=(), seconds: float = 0.0) -> EvalReport:
    """Per-benchmark scores in order of first appearance, and their unweighted average (the paper's Avg.)."""
    by_bench: dict[str, list[QuestionResult]] = {}
    for r in results:
        by_bench.setdefault(r.benchmark, []).append(r)
    benchmarks = {b: score_benchmark(rs, pass_k) for b, rs in by_bench.items()}
    average = {"pass@1": sum(m["pass@1"] for m in benchmarks.values()) / len(benchmarks)} if benchmarks else {}
    return EvalReport(benchmarks, average, results, seconds)


# ---- generation -----------------------------------------------------------------------------------
def generate_and_grade(model, tokenizer, items: list[EvalItem], verify: Verify, *, samples: int = 1,
                       temperature: float = 0.6, top_p: float = 1.0, max_new_tokens: int = 8192,
                       max_prompt_tokens: int = 1024, batch_size: int = 64, seed: int = 0,
                       progress: Callable[[int, int], None] | None = None, engine=None,
                       require_think: bool = False, decode_streams: int = 1,
                       decode_matmul: str = "auto") -> list[QuestionResult]:
    """Sample `repeats * samples` responses per item with the rollout engine and grade them.

    Each item is graded by its own grader (`EvalItem.grader`): `verify` (math-verify) gets the math
    rows only, multiple-choice rows are graded by their final letter (`rewards.grade_rows`);
    `require_think` applies to the latter (the math verifier carries its own setting).

    Prompts are sorted by length so a batch pads little; each chunk of about `batch_size`
    sequences is generated, then verified in a background thread while the next chunk generates
    (`verify` must be thread-safe: `MathVerifier.verify` is). Runs under a forked RNG seeded with `seed`. `engine`: any
    object with the rollout engine's `generate` already set to top_p / batch_size (e.g. a training
    run's team of processes); default: a transformers engine over `model` that computes tokens only (no
    log-probs or entropies: the same tokens) and decodes in `decode_streams` parts (`rollout.decode_streams`)
    with `decode_matmul`'s products (`rollout.decode_matmul`).
    """
    if engine is None:
        engine = own_engine(model, tokenizer)
        engine.top_p, engine.batch_size = top_p, batch_size
        engine.scores, engine.streams, engine.matmul = False, decode_streams, decode_matmul
    prompts = [data.prompt_token_ids(tokenizer, it.question, max_prompt_tokens) for it in items]
    order = sorted(range(len(items)), key=lambda i: (items[i].repeats, len(prompts[i])))
    results: list[QuestionResult | None] = [None] * len(items)
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    done = 0

    def record(chunk: list[int], n: int, gens, grading) -> None:
        nonlocal done
        grades = grading.result()
        for j, i in enumerate(chunk):
            gs, gr = gens[j], grades[j * n:(j + 1) * n]
            q = items[i].question
            results[i] = QuestionResult(
                uid=q.uid, benchmark=items[i].benchmark, answer=q.answer, n=n,
                correct=sum(1 for r, _ in gr if r > 0), reasons=dict(Counter(reason for _, reason in gr)),
                response_tokens=sum(len(g.response_ids) for g in gs),
                truncated=sum(g.truncated for g in gs), example=gs[0].text)
        done += len(chunk)
        if progress:
            progress(done, len(items))

    # a chunk is graded (worker processes) while the next one is generated
    with torch.random.fork_rng(devices=devices), ThreadPoolExecutor(max_workers=1) as grader:
        torch.manual_seed(seed)
        pending = None
        for chunk in _chunks(order, [items[i].repeats * samples for i in order], batch_size):
            n = items[chunk[0]].repeats * samples
            gens = engine.generate([prompts[i] for i in chunk], n, temperature=temperature,
                                   max_new_tokens=max_new_tokens)
            texts = [g.text for gs in gens for g in gs]
            answers = [items[i].question.answer for i in chunk for _ in range(n)]
            graders = [items[i].grader for i in chunk for _ in range(n)]
            grading = grader.submit(rewards.grade_rows, verify, texts, answers, graders,
                                    require_think=require_think)
            if pending:
                record(*pending)
            pending = (chunk, n, gens, grading)
        if pending:
            record(*pending)
    return results  # type: ignore[return-value]


def own_engine(model, tokenizer) -> TransformersEngine:
    """The evaluation engine of `model` and `tokenizer`, built once and kept on the model, so later calls
    reuse its bf16 inference copy and compiled decode steps (the copy refreshes only after a weight change)."""
    kept = getattr(model, "_exgrpo_eval_engine", None)
    if kept is None or kept.tokenizer is not tokenizer:
        kept = TransformersEngine(model, tokenizer)
        model.__dict__["_exgrpo_eval_engine"] = kept  # not a submodule, not in the state dict
    return kept


def _chunks(order: list[int], sizes: list[int], budget: int) -> list[list[int]]:
    """Consecutive runs of items with the same sample count, each about `budget` sequences."""
    out: list[list[int]] = []
    current: list[int] = []
    used = current_n = 0
    for i, n in zip(order, sizes):
        if current and (used + n > budget or n != current_n):
            out.append(current)
            current, used = [], 0
        current.append(i)
        used, current_n = used + n, n
    if current:
        out.append(current)
    return out


def evaluate_items(model, tokenizer, items: list[EvalItem], verify: Verify, *, pass_k=(), **gen) -> EvalReport:
    """`generate_and_grade` then `score`, timed."""
    if not items:
        raise ValueError("nothing to evaluate: the suites hold no questions")
    t0 = time.perf_counter()
    results = generate_and_grade(model, tokenizer, items, verify, **gen)
    return score(results, pass_k, seconds=time.perf_counter() - t0)


def save_report(store, run_id: str, step: int, report: EvalReport) -> None:
    """One `save_eval` per benchmark and one for the average (n = distinct questions)."""
    for bench, m in report.benchmarks.items():
        store.save_eval(run_id, step, bench, m, int(m["questions"]))
    store.save_eval(run_id, step, AVERAGE, report.average, len(report.questions))
