"""Transformers rollout engine: shapes, truncation, EOS handling, and log-probs that match the trainer."""

import pytest
import torch

from exgrpo_core.models.build import build_tiny_model, build_tiny_tokenizer
from exgrpo_core.rollout.engine import TransformersEngine
from exgrpo_core.training import policy
from exgrpo_core.training.batch import collate
from exgrpo_core.types import Rollout


@pytest.fixture(scope="module")
def engine():
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, seed=0)
    return TransformersEngine(model, tok, batch_size=5)


def _prompts(engine):
    return [engine.tokenizer("1+2=")["input_ids"], engine.tokenizer("31+4=")["input_ids"]]


def test_returns_n_generations_per_prompt_with_consistent_fields(engine):
    torch.manual_seed(0)
    out = engine.generate(_prompts(engine), 3, temperature=1.0, max_new_tokens=6)
    assert [len(g) for g in out] == [3, 3]
    for g in (g for group in out for g in group):
        assert 1 <= len(g.response_ids) <= 6
        assert len(g.logprobs) == len(g.response_ids) == len(g.entropies)
        assert all(lp <= 0 for lp in g.logprobs) and all(e >= 0 for e in g.entropies)
        ends_with_eos = g.response_ids[-1] in engine.eos_ids
        assert g.truncated == (not ends_with_eos and len(g.response_ids) == 6)
        assert all(t not in engine.eos_ids for t in g.response_ids[:-1]), "tokens after EOS were kept"


@pytest.mark.parametrize("share_prefill", [True, False])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampler_logprobs_match_trainer_forward_at_the_same_temperature(engine, temperature, share_prefill):
    torch.manual_seed(1)
    prompts = _prompts(engine)
    engine.share_prefill = share_prefill
    try:
        gens = engine.generate(prompts, 3, temperature=temperature, max_new_tokens=5)  # chunks of 5 + 1 rows
    finally:
        engine.share_prefill = True
    rollouts = [Rollout("q", p, g.response_ids, g.logprobs, g.text, g.truncated, 0)
                for p, group in zip(prompts, gens) for g in group]
    batch = collate(rollouts, [0.0] * len(rollouts), engine.pad_id)
    with torch.no_grad():
        logp, ent = policy.token_logprobs_and_entropy(engine.model, batch.input_ids, batch.attention_mask,
                                                      micro_batch_size=4, temperature=temperature)
    torch.testing.assert_close(logp[batch.response_mask], batch.old_logprobs[batch.response_mask],
                               atol=1e-4, rtol=1e-4)
    sampler_ent = torch.tensor([e for group in gens for g in group for e in g.entropies])
    torch.testing.assert_close(ent[batch.response_mask], sampler_ent, atol=1e-4, rtol=1e-4)


def test_lower_temperature_sharpens_the_sampler_distribution(engine):
    torch.manual_seed(2)
    hot = engine.generate(_prompts(engine), 4, temperature=1.0, max_new_tokens=4)
    cold = engine.generate(_prompts(engine), 4, temperature=0.1, max_new_tokens=4)
    mean = lambda gens: sum(e for grp in gens for g in grp for e in g.entropies) / sum(
        len(g.entropies) for grp in gens for g in grp)
    assert mean(cold) < mean(hot)


def test_repeated_prompts_are_embedded_once_before_sampling(engine):
    """K samples of a prompt share one prompt forward: the embedding sees each distinct prompt's tokens
    once (plus one token per row and step), not K times."""
    prompts = _prompts(engine)
    seen = []
    hook = engine.model.get_input_embeddings().register_forward_hook(lambda _m, a, _o: seen.append(a[0].numel()))
    try:
        torch.manual_seed(3)
        engine.generate(prompts, 2, temperature=1.0, max_new_tokens=1)  # 4 rows, one chunk
    finally:
        hook.remove()
    width = max(len(p) for p in prompts)
    assert seen == [2 * (width - 1), 4]  # two distinct prompts minus their last column, then the 4 last tokens


def test_per_prompt_counts_sample_in_one_batch(engine):
    """ExGRPO's mixed batch: K samples for fresh questions, K-1 for replayed ones, one generate call."""
    prompts = _prompts(engine)
    calls = []
    original = engine._generate_chunk
    engine._generate_chunk = lambda rows, *a: calls.append(len(rows)) or original(rows, *a)
    try:
        torch.manual_seed(4)
        out = engine.generate(prompts, [3, 2], temperature=1.0, max_new_tokens=3)
    finally:
        engine._generate_chunk = original
    assert [len(g) for g in out] == [3, 2] and calls == [5]
    with pytest.raises(ValueError, match="2 sample counts for 1 prompts"):
        engine.generate(prompts[:1], [1, 2], temperature=1.0, max_new_tokens=3)
    with pytest.raises(ValueError, match="at least one sample"):
        engine.generate(prompts, [1, 0], temperature=1.0, max_new_tokens=3)
