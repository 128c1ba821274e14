"""The OOD suite (ExGRPO Table 1, right half): shipped ARC-c + GPQA-Diamond, MMLU-Pro by name, graded by
the final choice letter beside math rows, and the declared ID / OOD groups behind the ID Avg / OOD Avg.

Run: .venv/bin/python -m pytest tests/exgrpo_core/evaluation/test_evaluation_ood.py -q
"""

from __future__ import annotations

import re
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from exgrpo_core.data import questions as data
from exgrpo_core.evaluation import evaluate as E, suites as S
from exgrpo_core.types import Generation, Question


def test_shipped_ood_suite_holds_arc_c_and_gpqa_diamond_graded_by_choice():
    items = E.load_suite("ood")
    assert Counter(it.benchmark for it in items) == {"ARC-c": 1172, "GPQA-Diamond": 198}
    assert {it.grader for it in items} == {"choice"} and {it.repeats for it in items} == {1}  # pass@1
    golds = Counter(it.question.answer for it in items)
    assert set(golds) <= set("ABCDE12345") and golds["A"] > 200  # letters, a few ARC digit labels
    assert all(it.question.messages[0]["role"] == "system" for it in items)  # the authors' prompt kept
    gpqa = [it for it in items if it.benchmark == "GPQA-Diamond"]
    assert all("'ANSWER: $LETTER'" in it.question.text for it in gpqa)


def test_the_shipped_file_is_small_and_the_math_suites_stay_on_math_verify():
    assert (data.BUNDLED_DIR / S.SUITES["ood"]).stat().st_size < 200_000
    assert {it.grader for it in E.load_suite("paper-valid")} == {"math"}
    assert {it.grader for it in E.load_suite("gsm8k", max_questions=3)} == {"math"}


def test_id_and_ood_are_declared_for_every_benchmark_of_table_1():
    table1_id = {"AIME24", "AIME25", "AMC", "MATH-500", "Minerva", "OlympiadBench"}
    table1_ood = {"ARC-c", "GPQA-Diamond", "MMLU-Pro"}
    assert {b.name for b in S.BENCHMARKS.values() if b.group == S.ID} == table1_id
    assert {b.name for b in S.BENCHMARKS.values() if b.group == S.OOD} == table1_ood
    assert {S.group_of(it.benchmark) for it in E.load_suite("paper-valid")} == {S.ID}
    assert {S.group_of(it.benchmark) for it in E.load_suite("ood")} == {S.OOD}
    assert S.group_of("GSM8K") is None and S.group_of("my-benchmark") is None  # not guessed from names
    assert S.group_of("math-olympiad-ood") is None


def test_a_rows_reward_style_can_ask_for_the_choice_grader(tmp_path):
    path = tmp_path / "quiz.parquet"
    prompt = [{"role": "user", "content": "Which is a gas?\n\nA) iron\nB) neon"}]
    pq.write_table(pa.Table.from_pylist([
        {"data_source": "my_quiz", "prompt": prompt, "reward_model": {"ground_truth": "B", "style": "choice"}},
        {"data_source": "my_quiz2", "prompt": prompt, "reward_model": {"ground_truth": "B", "style": "rule"}}]), path)
    assert [(it.benchmark, it.grader) for it in E.load_suite(str(path))] == [("my_quiz", "choice"),
                                                                               ("my_quiz2", "math")]
    flat = tmp_path / "quiz.jsonl"
    flat.write_text('{"question": "Which is a gas? A) iron B) neon", "answer": "B", "reward_style": "choice"}\n')
    assert [it.grader for it in E.load_suite(str(flat))] == ["choice"]


class _ScriptedEngine:
    """A rollout engine that answers each prompt with a fixed response, per prompt in call order."""

    def __init__(self, tokenizer, replies: dict[str, str]):
        self.tokenizer, self.replies = tokenizer, replies

    def generate(self, prompts, n, *, temperature, max_new_tokens):
        out = []
        for ids in prompts:
            prompt = self.tokenizer.decode(ids)
            text = next(r for key, r in self.replies.items() if key in prompt)
            out.append([Generation([1, 2], [0.0, 0.0], text, False) for _ in range(n)])
        return out


def test_generation_grades_choice_rows_by_letter_and_only_math_rows_through_verify():
    from exgrpo_core.models.build import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    q = [Question("m", ({"role": "user", "content": "1+1"},), "2", "math"),
         Question("a", ({"role": "user", "content": "2+2"},), "C", "arc_c"),
         Question("g", ({"role": "user", "content": "3+3"},), "A", "gpqa")]
    items = S.group_repeats(q)
    engine = _ScriptedEngine(tok, {"1+1": "so \\boxed{2}", "2+2": "ANSWER: C", "3+3": "ANSWER: A or B"})
    sent = []

    def math_only(texts, answers):
        sent.extend(zip(texts, answers))
        return [(1.0, "correct")] * len(texts)

    results = E.generate_and_grade(None, tok, items, math_only, samples=2, max_prompt_tokens=16, engine=engine)
    by_uid = {r.uid: r for r in results}
    assert sent == [("so \\boxed{2}", "2")] * 2  # the verifier never sees a multiple-choice row
    assert by_uid["a"].correct == 2 and by_uid["a"].reasons == {"correct": 2}
    assert by_uid["g"].correct == 0 and by_uid["g"].reasons == {"ambiguous": 2}
    report = E.score(results)
    assert report.group_averages() == {"id": 1.0, "ood": pytest.approx(0.5)}


def test_group_averages_are_unweighted_over_the_declared_benchmarks():
    pass1 = {"AIME24": 0.2, "MATH-500": 0.6, "ARC-c": 0.9, "GPQA-Diamond": 0.3, "GSM8K": 0.5, "mine": 0.0}
    assert E.group_averages(pass1) == {"id": pytest.approx(0.4), "ood": pytest.approx(0.6)}
    assert E.group_averages({"GSM8K": 0.5}) == {}


# ---- MMLU-Pro by name -----------------------------------------------------------------------------
MMLU_ROWS = [{"question_id": 70, "question": "Which organ filters blood?", "options": ["heart", "kidney", "lung"],
              "answer": "B", "answer_index": 1, "category": "biology", "src": "x"}]


def test_mmlu_pro_loads_by_name_with_the_gpqa_prompt_and_choice_grading(monkeypatch):
    import datasets  # a declared dependency: a missing one fails, never skips
    calls = []
    monkeypatch.setattr(datasets, "load_dataset", lambda name, split: calls.append((name, split)) or MMLU_ROWS)
    (item,) = E.load_suite("mmlu-pro")
    assert calls == [("TIGER-Lab/MMLU-Pro", "test")]
    assert (item.benchmark, item.grader, item.question.answer, item.question.uid) == (
        "MMLU-Pro", "choice", "B", "mmlu_pro-70")
    system, user = item.question.messages
    gpqa = next(it for it in E.load_suite("ood") if it.benchmark == "GPQA-Diamond").question
    assert system == gpqa.messages[0]  # the authors' system prompt
    assert gpqa.text.startswith(S.MC_INSTRUCTION.format(letters="ABCD") + "\n\n")  # their instruction
    assert user["content"].startswith(S.MC_INSTRUCTION.format(letters="ABC"))
    assert user["content"].endswith("Which organ filters blood?\n\nA) heart\nB) kidney\nC) lung")


def test_mmlu_pro_without_the_hub_is_one_clear_line(monkeypatch):
    import datasets  # a declared dependency: a missing one fails, never skips

    def offline(name, split):
        raise ConnectionError("Couldn't reach 'TIGER-Lab/MMLU-Pro' on the Hub\n(OfflineModeIsEnabled)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(data.DataError) as err:
        E.load_suite("mmlu-pro")
    message = str(err.value)
    assert "\n" not in message and err.value.__cause__ is None and err.value.__suppress_context__
    assert re.match(r"suite mmlu-pro: cannot load TIGER-Lab/MMLU-Pro .*ConnectionError.*hub access", message)
    assert "`ood`" in message  # points to what works offline
