"""Evaluation scores (paper §4): unbiased pass@k, pass@1 as avg@k, repeated-row grouping on a verl
parquet, per-source breakdown, generation through the rollout engine, and the eval results in the DB.

Run: `.venv/bin/python -m pytest tests/exgrpo_core/test_evaluation.py -q`.
"""

from __future__ import annotations

import math
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from store_helpers import new_run, store  # noqa: F401

from exgrpo_core.data.questions import DataError
from exgrpo_core.evaluation import evaluate as E
from exgrpo_core.models.build import build_tiny_model, build_tiny_tokenizer
from exgrpo_core.types import Question


def _qr(bench, n, c, uid="q", reasons=None):
    return E.QuestionResult(uid=uid, benchmark=bench, answer="1", n=n, correct=c,
                            reasons=reasons or {"correct": c, "wrong": n - c}, response_tokens=2 * n, truncated=0)


# ---- pass@k / avg@k ------------------------------------------------------------------------------
def test_pass_at_k_hand_worked_values():
    # n=4, c=1, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5
    assert E.pass_at_k(4, 1, 2) == pytest.approx(0.5)
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7
    assert E.pass_at_k(5, 2, 2) == pytest.approx(0.7)
    # k=1 is the plain fraction correct; c=0 never passes; n-c < k always passes
    assert E.pass_at_k(8, 3, 1) == pytest.approx(3 / 8)
    assert E.pass_at_k(8, 0, 4) == 0.0
    assert E.pass_at_k(8, 6, 3) == 1.0


def test_pass_at_k_matches_binomial_reference_and_grows_with_k_and_c():
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(1, 64)
        c, k = rng.randint(0, n), rng.randint(1, n)
        ref = 1 - math.comb(n - c, k) / math.comb(n, k)
        assert E.pass_at_k(n, c, k) == pytest.approx(ref, abs=1e-12)
        if k < n:
            assert E.pass_at_k(n, c, k + 1) >= E.pass_at_k(n, c, k) - 1e-12
        if c < n:
            assert E.pass_at_k(n, c + 1, k) >= E.pass_at_k(n, c, k) - 1e-12


def test_pass_at_k_rejects_impossible_counts():
    with pytest.raises(ValueError, match="k <= n"):
        E.pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="c <= n"):
        E.pass_at_k(4, 5, 1)


def test_avg_at_k_is_mean_of_per_question_fractions_not_of_samples():
    # question a: 1 of 4 right (0.25); question b: 1 of 1 right (1.0) -> (0.25 + 1.0) / 2 = 0.625,
    # where pooling the 5 samples would give 2/5 = 0.4
    assert E.avg_at_k([_qr("X", 4, 1), _qr("X", 1, 1)]) == pytest.approx(0.625)


def test_scores_break_down_by_source_and_average_benchmarks_unweighted():
    results = [_qr("AIME24", 32, 8, "a1"), _qr("AIME24", 32, 16, "a2"),
               _qr("MATH-500", 1, 1, "m1"), _qr("MATH-500", 1, 0, "m2"), _qr("MATH-500", 1, 0, "m3"),
               _qr("MATH-500", 1, 1, "m4", reasons={"correct": 1})]
    rep = E.score(results, pass_k=[2, 8])
    aime, math500 = rep.benchmarks["AIME24"], rep.benchmarks["MATH-500"]
    assert aime["pass@1"] == pytest.approx((8 / 32 + 16 / 32) / 2)  # 0.375
    assert aime["samples"] == 32 and aime["questions"] == 2
    # pass@2 per question: 1 - C(24,2)/C(32,2) = 1 - 276/496; 1 - C(16,2)/C(32,2) = 1 - 120/496
    assert aime["pass@2"] == pytest.approx(((1 - 276 / 496) + (1 - 120 / 496)) / 2)
    assert "pass@8" in aime
    assert math500["pass@1"] == pytest.approx(0.5) and "pass@2" not in math500  # single sample: no pass@2
    assert rep.average["pass@1"] == pytest.approx((0.375 + 0.5) / 2)  # per benchmark, not per question
    summary = rep.summary()
    assert set(summary) == {"AIME24", "MATH-500", "average"}


# ---- suites and repeated rows ---------------------------------------------------------------------
def _verl_rows(spec):
    rows = []
    for index, (source, text, answer, repeats) in enumerate(spec):
        for _ in range(repeats):
            rows.append({"data_source": source, "ability": "math",
                         "prompt": [{"role": "system", "content": "Think."}, {"role": "user", "content": text}],
                         "reward_model": {"ground_truth": answer, "style": "rule"},
                         "extra_info": {"index": index, "split": "test"}})
    return rows


def test_repeated_verl_rows_become_one_question_sampled_that_many_times(tmp_path):
    path = tmp_path / "test.parquet"
    pq.write_table(pa.Table.from_pylist(_verl_rows([
        ("aime", "1+1?", "2", 4), ("aime", "2+2?", "4", 4), ("math", "3+3?", "6", 1),
        ("math", "4+4?", "8", 1), ("minerva", "1+1?", "2", 1)])), path)
    items = E.load_suite(str(path))
    assert [(i.benchmark, i.question.text, i.repeats) for i in items] == [
        ("AIME24", "1+1?", 4), ("AIME24", "2+2?", 4), ("MATH-500", "3+3?", 1), ("MATH-500", "4+4?", 1),
        ("Minerva", "1+1?", 1)]  # same text under another source stays its own question
    capped = E.load_suite(str(path), max_questions=1)
    assert [(i.benchmark, i.repeats) for i in capped] == [("AIME24", 4), ("MATH-500", 1), ("Minerva", 1)]


def test_shipped_paper_suite_is_avg_at_32_on_aime_and_amc():
    items = E.load_suite("paper")
    counts: dict[str, tuple[int, set]] = {}
    for it in items:
        n, reps = counts.get(it.benchmark, (0, set()))
        counts[it.benchmark] = (n + 1, reps | {it.repeats})
    assert counts == {"AIME24": (30, {32}), "AIME25": (30, {32}), "AMC": (83, {32}), "MATH-500": (500, {1}),
                      "Minerva": (272, {1}), "OlympiadBench": (675, {1})}
    valid = {it.benchmark: it.repeats for it in E.load_suite("paper-valid")}
    assert valid["AIME24"] == 8 and valid["AMC"] == 4


def test_shipped_gsm8k_suite_grades_the_number_after_hashes():
    items = E.load_suite("gsm8k", max_questions=2)
    assert [i.benchmark for i in items] == ["GSM8K", "GSM8K"] and items[0].question.answer == "18"


def test_missing_suite_is_a_data_error_naming_it(tmp_path):
    with pytest.raises(DataError, match="nope.parquet: file not found"):
        E.load_suite(str(tmp_path / "nope.parquet"))


# ---- generation ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    tok = build_tiny_tokenizer()
    return build_tiny_model(tok, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, seed=0), tok


def _items():
    qs = [Question(f"q{i}", ({"role": "user", "content": f"{i}+1"},), str(i + 1), "tiny") for i in range(5)]
    return [E.EvalItem(qs[0], "A", repeats=3)] + [E.EvalItem(q, "B") for q in qs[1:]]


def test_generation_samples_repeats_times_samples_and_counts_the_verifier_verdicts(tiny):
    model, tok = tiny
    calls = []

    def every_other(texts, answers):  # a fake verifier: odd positions of each call are correct
        calls.append(len(texts))
        return [(1.0, "correct") if i % 2 else (0.0, "wrong") for i in range(len(texts))]

    res = E.generate_and_grade(model, tok, _items(), every_other, samples=2, max_new_tokens=3,
                               max_prompt_tokens=16, batch_size=4)
    assert [r.n for r in res] == [6, 2, 2, 2, 2]  # 3 repeats x 2 samples; then 1 x 2
    assert sum(calls) == 6 + 4 * 2 and max(calls) <= 6  # batched in chunks of about batch_size sequences
    assert all(r.correct == r.n // 2 and r.reasons == {"correct": r.n // 2, "wrong": r.n // 2} for r in res)
    assert all(0 < r.response_tokens <= 3 * r.n for r in res)


def test_generation_is_seeded_and_leaves_the_callers_random_stream_alone(tiny):
    model, tok = tiny
    texts = []

    def record(t, a):
        texts.append(list(t))
        return [(0.0, "wrong")] * len(t)

    torch.manual_seed(123)
    E.generate_and_grade(model, tok, _items(), record, max_new_tokens=4, max_prompt_tokens=16, seed=7)
    after = torch.rand(3)
    torch.manual_seed(999)
    E.generate_and_grade(model, tok, _items(), record, max_new_tokens=4, max_prompt_tokens=16, seed=7)
    torch.manual_seed(123)
    assert torch.equal(torch.rand(3), after), "evaluation consumed the caller's RNG"
    assert texts[: len(texts) // 2] == texts[len(texts) // 2:], "same seed, different samples"


def test_calls_without_an_engine_reuse_one_engine_and_sample_as_a_fresh_one(tiny, monkeypatch):
    model, tok = tiny
    built, texts = [], []
    real = E.TransformersEngine

    def counting(*a, **k):
        built.append(1)
        return real(*a, **k)

    def record(t, a):
        texts.append(list(t))
        return [(0.0, "wrong")] * len(t)

    monkeypatch.setattr(E, "TransformersEngine", counting)
    model.__dict__.pop("_exgrpo_eval_engine", None)
    E.generate_and_grade(model, tok, _items(), record, max_new_tokens=4, max_prompt_tokens=16, seed=7)
    first = list(texts)
    E.generate_and_grade(model, tok, _items(), record, max_new_tokens=4, max_prompt_tokens=16, seed=7,
                         batch_size=2, top_p=0.5)
    engine = E.own_engine(model, tok)
    assert len(built) == 1, "a second evaluation built a second engine (and bf16 copy)"
    assert (engine.batch_size, engine.top_p, engine.scores) == (2, 0.5, False), "the call's settings were not applied"
    model.__dict__.pop("_exgrpo_eval_engine")
    texts.clear()
    E.generate_and_grade(model, tok, _items(), record, max_new_tokens=4, max_prompt_tokens=16, seed=7)
    assert texts == first, "a reused engine samples differently from a fresh one"
    assert "_exgrpo_eval_engine" not in model.state_dict()


def test_evaluate_items_with_math_verify_and_save_report_round_trip(tiny, store):  # noqa: F811
    from exgrpo_core.reward.grading import MathVerifier

    model, tok = tiny
    items = [E.EvalItem(Question("q", ({"role": "user", "content": "1+1"},), "2", "tiny"), "B", repeats=2)]
    with MathVerifier(timeout_s=5.0) as v:
        rep = E.evaluate_items(model, tok, items, v.verify, samples=2, max_new_tokens=2, max_prompt_tokens=16,
                               pass_k=[4])
    m = rep.benchmarks["B"]
    assert m["samples"] == 4 and 0.0 <= m["pass@1"] <= m["pass@4"] <= 1.0 and rep.seconds > 0
    run_id, _ = new_run(store)
    E.save_report(store, run_id, 3, rep)
    E.save_report(store, run_id, 3, rep)  # re-evaluating a step replaces its rows
    E.save_report(store, run_id, 5, rep)
    evals = store.get_evals(run_id)
    assert [(e["step"], e["benchmark"]) for e in evals] == [(3, "B"), (3, "average"), (5, "B"), (5, "average")]
    assert evals[0]["metrics"] == pytest.approx(m) and evals[0]["n"] == 1
    assert evals[1]["metrics"] == {"pass@1": pytest.approx(m["pass@1"])}
    store.rollback_to(run_id, 4)
    assert [e["step"] for e in store.get_evals(run_id)] == [3, 3]


def test_a_chunk_is_graded_while_the_next_one_generates(tiny):
    """Grading runs beside generation: the first chunk's verify call waits (up to 10 s) for the second
    chunk's generate to start, which happens only if grading is off the generating thread; the results
    are those of grading after each chunk."""
    import threading

    from exgrpo_core.rollout.engine import TransformersEngine

    model, tok = tiny
    engine = TransformersEngine(model, tok, batch_size=4)
    second_started, events = threading.Event(), []
    generate = engine.generate

    def marked(prompts, n, **kw):
        events.append("generate")
        if events.count("generate") == 2:
            second_started.set()
        return generate(prompts, n, **kw)

    def verify(texts, answers):
        if not events.count("graded"):
            events.append("overlapped" if second_started.wait(10) else "serial")
        events.append("graded")
        return [(1.0, "correct")] * len(texts)

    engine.generate = marked
    res = E.generate_and_grade(model, tok, _items(), verify, samples=2, max_new_tokens=3, max_prompt_tokens=16,
                               batch_size=4, engine=engine)
    assert "overlapped" in events and "serial" not in events
    assert [r.n for r in res] == [6, 2, 2, 2, 2] and all(r.correct == r.n for r in res)
