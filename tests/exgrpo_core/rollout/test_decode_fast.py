"""Evaluation's tokens-only decoding (`scores=False`) and decoding in concurrent parts (`streams`): the
same tokens as the plain decoder for a fixed seed, token for token, and the random stream left where
the plain decoder leaves it."""

import pytest
import torch

from exgrpo_core.rollout.engine import stream_parts

# the `engine` fixture: conftest.py's default
PROMPTS = ("1+2=", "31+4=", "7*8=", "100-1=", "5+5=", "12*3=", "9-4=")


def _run(engine, seed, n=5, max_new_tokens=12, temperature=1.0, top_p=1.0, **settings):
    """(generations, the next uniform after them) with engine attributes set meanwhile."""
    saved = {k: getattr(engine, k) for k in (*settings, "top_p")}
    for k, v in {**settings, "top_p": top_p}.items():
        setattr(engine, k, v)
    try:
        torch.manual_seed(seed)
        prompts = [engine.tokenizer(t)["input_ids"] for t in PROMPTS]
        out = engine.generate(prompts, n, temperature=temperature, max_new_tokens=max_new_tokens)
        return [g for grp in out for g in grp], float(torch.rand(1))
    finally:
        for k, v in saved.items():
            setattr(engine, k, v)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.6, 1.0), (0.7, 0.8), (0.0, 1.0)])
def test_tokens_only_decoding_samples_the_same_tokens(engine, seed, temperature, top_p):
    full, after_full = _run(engine, seed, temperature=temperature, top_p=top_p)
    fast, after_fast = _run(engine, seed, temperature=temperature, top_p=top_p, scores=False)
    assert [g.response_ids for g in fast] == [g.response_ids for g in full]
    assert [g.truncated for g in fast] == [g.truncated for g in full]
    assert [g.text for g in fast] == [g.text for g in full]
    assert all(g.logprobs == [] and g.entropies == [] for g in fast)  # nothing computed, nothing returned
    assert after_fast == after_full
    if temperature > 0:
        assert len({tuple(g.response_ids) for g in full}) > 3  # really sampled


@pytest.mark.parametrize("seed", [0, 2])
@pytest.mark.parametrize("streams", [2, 3])
@pytest.mark.parametrize("scores", [True, False])
def test_decoding_in_parts_samples_the_same_tokens_and_leaves_the_stream_alike(engine, seed, streams, scores):
    one, after_one = _run(engine, seed, temperature=0.7, scores=scores)
    parts, after_parts = _run(engine, seed, temperature=0.7, scores=scores, streams=streams, min_stream_rows=4)
    assert [g.response_ids for g in parts] == [g.response_ids for g in one]
    assert [g.truncated for g in parts] == [g.truncated for g in one]
    for a, b in zip(parts, one):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
        assert a.entropies == pytest.approx(b.entropies, abs=1e-5)
    assert after_parts == after_one  # the next draw: steps x n uniforms consumed, as one batch
    lengths = [len(g.response_ids) for g in one]
    assert min(lengths) < max(lengths)  # rows end at different steps: parts end at different steps


def test_parts_run_single_threaded_each_and_leave_the_callers_threads(engine):
    seen = []
    hook = engine.model.get_input_embeddings().register_forward_hook(
        lambda _m, a, _o: seen.append((a[0].shape[0], torch.get_num_threads())))
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        _run(engine, 0, n=4, max_new_tokens=3, streams=2, min_stream_rows=4)
        assert torch.get_num_threads() == 2
    finally:
        hook.remove()
        torch.set_num_threads(saved)
    assert seen and all(threads == 1 for _, threads in seen)
    assert max(rows for rows, _ in seen) <= 14  # 28 rows in two parts


def test_stream_parts_cut_near_equal_ranges_of_at_least_min_rows():
    assert stream_parts(10, 2, 4) == [(0, 5), (5, 10)]
    assert stream_parts(7, 2, 4) == [(0, 7)]  # two parts would hold fewer than 4 rows
    assert stream_parts(9, 3, 3) == [(0, 3), (3, 6), (6, 9)]
    assert stream_parts(5, 1, 1) == [(0, 5)]
    assert stream_parts(0, 2, 1) == [(0, 0)]
