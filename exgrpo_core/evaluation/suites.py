"""Evaluation suites: the shipped names, the benchmark table (table name; in- or out-of-distribution), hub suites.

`BENCHMARKS` declares, per verl `data_source`, the benchmark's name in tables and its group in the
paper's Table 1: `id` (the math benchmarks, "ID Avg") or `ood` (ARC-c, GPQA-Diamond, MMLU-Pro,
"OOD Avg"). A source missing from it keeps its own name and belongs to no group. Each row's grader
(math-verify or the final choice letter) is chosen by `grading.grader_for`. A suite is a shipped
name (`SUITES`), a hub name (`HUB_SUITES`, loaded with `datasets`), or anything `data.load_questions`
reads; repeated rows of one question become one `EvalItem` sampled that many times.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass

from exgrpo_core.data import questions as data
from exgrpo_core.reward import grading
from exgrpo_core.types import Question

ID, OOD = "id", "ood"
GROUPS = (ID, OOD)


@dataclass(frozen=True)
class Benchmark:
    name: str
    """Column name in tables (the paper's)."""
    group: str | None = None
    """ID (in-distribution), OOD, or None (in no group average)."""


BENCHMARKS = {
    "aime": Benchmark("AIME24", ID), "aime25": Benchmark("AIME25", ID), "amc": Benchmark("AMC", ID),
    "math": Benchmark("MATH-500", ID), "minerva": Benchmark("Minerva", ID),
    "olympiad_bench": Benchmark("OlympiadBench", ID),
    "arc_c": Benchmark("ARC-c", OOD), "gpqa": Benchmark("GPQA-Diamond", OOD),
    "gpqa_diamond": Benchmark("GPQA-Diamond", OOD), "mmlu_pro": Benchmark("MMLU-Pro", OOD),
    "gsm8k-test": Benchmark("GSM8K"),
}
"""verl `data_source` (or dataset name) -> the benchmark; in the paper's column order."""
SUITES = {"paper": "exgrpo-eval-test.parquet", "paper-valid": "exgrpo-eval-valid.parquet",
          "gsm8k": "gsm8k-test.jsonl", "ood": "exgrpo-eval-ood.parquet"}
"""Shipped suites (exgrpo_core/data/datasets/eval-suites.md): name -> file in the bundled folder."""
HUB_SUITES = {"mmlu-pro": ("TIGER-Lab/MMLU-Pro", "test", "mmlu_pro")}
"""Suites loaded by name from the Hugging Face hub: name -> (dataset, split, data_source)."""
MC_INSTRUCTION = ("Answer the following multiple choice question. The last line of your response should be of "
                  "the following format: 'ANSWER: $LETTER' (without quotes) where LETTER is one of {letters}. "
                  "Think step by step before answering.")
"""The GPQA rows' instruction (the authors' file), used for MMLU-Pro with the question's own letters."""


@dataclass(frozen=True)
class EvalItem:
    """One distinct question of a suite; `repeats` = rows of the suite that hold it."""

    question: Question
    benchmark: str
    repeats: int = 1
    grader: str = "math"
    """"math" (math-verify) or "choice" (final choice letter): `grading.grader_for` of the row."""


def benchmark_name(source: str) -> str:
    return BENCHMARKS[source].name if source in BENCHMARKS else source


def group_of(benchmark: str) -> str | None:
    """The declared group (ID / OOD) of a benchmark's table name; None when it is in no group."""
    return next((b.group for b in BENCHMARKS.values() if b.name == benchmark), None)


def resolve_suite(spec: str) -> str:
    """A shipped suite name or `bundled:NAME` of a shipped parquet -> its path; anything else unchanged."""
    if spec in SUITES:
        return str(data.BUNDLED_DIR / SUITES[spec])
    if spec.startswith("bundled:"):
        parquet = data.BUNDLED_DIR / f"{spec.removeprefix('bundled:')}.parquet"
        if parquet.is_file():
            return str(parquet)
    return spec


def group_repeats(questions: list[Question], max_questions: int | None = None) -> list[EvalItem]:
    """Merge rows with the same (source, messages, answer) into one item counting its repeats.

    Example: rows [a, a, a, b] -> [EvalItem(a, repeats=3), EvalItem(b, repeats=1)]. `max_questions`
    keeps the first N distinct questions of each benchmark.
    """
    items: dict[tuple, list] = {}
    for q in questions:
        key = (q.source, tuple(tuple(sorted(m.items())) for m in q.messages), q.answer)
        if key in items:
            items[key][1] += 1
        else:
            items[key] = [q, 1]
    out: list[EvalItem] = []
    per_bench: Counter = Counter()
    for q, repeats in items.values():
        bench = benchmark_name(q.source)
        if max_questions is not None and per_bench[bench] >= max_questions:
            continue
        per_bench[bench] += 1
        out.append(EvalItem(q, bench, repeats, grading.grader_for(q.source, q.reward_style)))
    return out


def load_suite(spec: str, *, question_key: str = "question", answer_key: str = "answer",
               system_prompt: str | None = None, instruction: str = "",
               max_questions: int | None = None, prompt_template: str = data.CHAT) -> list[EvalItem]:
    """Read a suite (see `resolve_suite`, `HUB_SUITES`) and group its repeated rows; raises DataError naming it.
    `prompt_template`: data.prompt_template, as training prompts (`data.load_questions`; a hub suite's
    {question} is its built user message)."""
    if spec in HUB_SUITES:
        hub = load_hub_suite(spec)
        if prompt_template != data.CHAT:
            hub = [data.with_template(q, prompt_template, q.text, instruction) for q in hub]
        return group_repeats(hub, max_questions)
    questions = data.load_questions(resolve_suite(spec), question_key=question_key, answer_key=answer_key,
                                    system_prompt=system_prompt, instruction=instruction,
                                    prompt_template=prompt_template)
    return group_repeats(questions, max_questions)


# ---- hub suites -----------------------------------------------------------------------------------
def load_hub_suite(name: str) -> list[Question]:
    """A `HUB_SUITES` suite as questions; without the hub (or `datasets`) one DataError line says so."""
    repo, split, source = HUB_SUITES[name]
    try:
        import datasets
        rows = datasets.load_dataset(repo, split=split)
    except Exception as err:  # noqa: BLE001 - offline, missing package, no such dataset: all "not reachable"
        reason = " ".join(f"{type(err).__name__}: {err}".split())[:200]
        raise data.DataError(
            f"suite {name}: cannot load {repo} (split {split}) from the Hugging Face hub ({reason}); it needs "
            f"hub access or a copy in the Hugging Face cache. The shipped OOD suite is `ood`") from None
    return [mmlu_pro_question(row, source) for row in rows]


def mmlu_pro_question(row: dict, source: str = "mmlu_pro") -> Question:
    """An MMLU-Pro row (question, options, answer letter) as a prompt built like the authors' GPQA rows."""
    letters = "ABCDEFGHIJ"[:len(row["options"])]
    options = "\n".join(f"{letter}) {text}" for letter, text in zip(letters, row["options"]))
    user = f"{MC_INSTRUCTION.format(letters=letters)}\n\n{row['question'].strip()}\n\n{options}"
    messages = ({"role": "system", "content": _authors_system_prompt()}, {"role": "user", "content": user})
    return Question(f"{source}-{row['question_id']}", messages, str(row["answer"]).strip(), source)


@functools.lru_cache(maxsize=1)
def _authors_system_prompt() -> str:
    """The system prompt of the shipped OOD rows (the authors' evaluation prompt)."""
    import pyarrow.parquet as pq

    first = pq.ParquetFile(data.BUNDLED_DIR / SUITES["ood"]).read_row_group(0, columns=["prompt"]).slice(0, 1)
    return next(m["content"] for m in first.to_pylist()[0]["prompt"] if m["role"] == "system")
