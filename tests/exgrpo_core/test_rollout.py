"""Transformers rollout engine: shapes, truncation, EOS handling, and log-probs that match the trainer."""

import pytest
import torch

from exgrpo_core import policy
from exgrpo_core.batch import collate
from exgrpo_core.models import build_tiny_model, build_tiny_tokenizer
from exgrpo_core.rollout import TransformersEngine
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


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampler_logprobs_match_trainer_forward_at_the_same_temperature(engine, temperature):
    torch.manual_seed(1)
    prompts = _prompts(engine)
    gens = engine.generate(prompts, 2, temperature=temperature, max_new_tokens=5)
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
