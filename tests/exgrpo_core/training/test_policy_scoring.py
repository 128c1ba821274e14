"""Scoring only the positions that matter (score_mask, logits_to_keep) changes no value and no gradient.

Run: .venv/bin/python -m pytest tests/exgrpo_core/test_policy_scoring.py -q
"""

from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.testing import assert_close
from transformers import LlamaConfig, LlamaForCausalLM

from exgrpo_core.training.policy import PolicyInputError, token_logprobs_and_entropy


@pytest.fixture(scope="module")
def llama():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=64)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(30.0)
    return model


class NoKeep(nn.Module):
    """The same LM behind a forward without `logits_to_keep`: full logits, the fallback path."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, attention_mask, position_ids, use_cache):
        return SimpleNamespace(logits=self.inner(input_ids=input_ids, attention_mask=attention_mask,
                                                 position_ids=position_ids, use_cache=use_cache).logits)


def _batch(prompt_lens, resp_lens, width, seed=0):
    """Right-padded prompt+response rows and their response mask."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 50, (len(prompt_lens), width), generator=g)
    am = torch.zeros(len(prompt_lens), width, dtype=torch.long)
    resp = torch.zeros(len(prompt_lens), width, dtype=torch.bool)
    for i, (p, t) in enumerate(zip(prompt_lens, resp_lens)):
        am[i, :p + t] = 1
        resp[i, p:p + t] = True
    return ids, am, resp


def _grads(model):
    out = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return out


@pytest.mark.parametrize("chunk", [1, 3, 1024])
def test_masked_scoring_equals_full_scoring_on_the_mask_and_zero_elsewhere(llama, chunk):
    ids, am, resp = _batch([5, 3, 6, 2], [3, 4, 1, 0], 9, seed=1)
    with torch.no_grad():
        lp, h = token_logprobs_and_entropy(llama, ids, am, micro_batch_size=4)
        lp_m, h_m = token_logprobs_and_entropy(llama, ids, am, micro_batch_size=2, score_mask=resp,
                                               chunk_positions=chunk)
    assert_close(lp_m[resp], lp[resp], atol=2e-5, rtol=1e-5)
    assert_close(h_m[resp], h[resp], atol=2e-5, rtol=1e-5)
    assert (lp_m[~resp] == 0).all() and (h_m[~resp] == 0).all()


def test_masked_scoring_gives_the_same_gradient_as_masking_afterwards(llama):
    ids, am, resp = _batch([4, 6, 3], [4, 2, 5], 9, seed=2)
    w = torch.randn(ids.shape, generator=torch.Generator().manual_seed(3))
    lp, h = token_logprobs_and_entropy(llama, ids, am, micro_batch_size=3)
    ((lp * w * resp).sum() + (h * resp).sum()).backward()
    full = _grads(llama)
    lp, h = token_logprobs_and_entropy(llama, ids, am, micro_batch_size=3, score_mask=resp)
    ((lp * w).sum() + h.sum()).backward()
    for a, b in zip(_grads(llama), full):
        assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_models_without_logits_to_keep_give_the_same_values(llama):
    ids, am, resp = _batch([5, 2], [3, 6], 8, seed=4)
    with torch.no_grad():
        a = token_logprobs_and_entropy(llama, ids, am, micro_batch_size=2, score_mask=resp)
        b = token_logprobs_and_entropy(NoKeep(llama), ids, am, micro_batch_size=2, score_mask=resp)
    assert_close(a[0], b[0], atol=2e-5, rtol=1e-5)
    assert_close(a[1], b[1], atol=2e-5, rtol=1e-5)


def test_the_head_runs_on_scored_positions_only_and_gradients_match_full_logits(llama):
    """The output head sees one [1, M, H] sequence of the M scored positions (not the [n, l] grid);
    values and gradients equal the full-logits path (NoKeep hides the head)."""
    ids, am, resp = _batch([5, 2, 4], [3, 6, 1], 9, seed=6)
    w = torch.randn(ids.shape, generator=torch.Generator().manual_seed(7))
    seen = []
    hook = llama.lm_head.register_forward_hook(lambda _m, args, _out: seen.append(tuple(args[0].shape)))
    try:
        lp, h = token_logprobs_and_entropy(llama, ids, am, micro_batch_size=3, score_mask=resp)
    finally:
        hook.remove()
    assert seen == [(1, int(resp.sum()), 32)]
    ((lp * w).sum() + h.sum()).backward()
    gathered = _grads(llama)
    lp2, h2 = token_logprobs_and_entropy(NoKeep(llama), ids, am, micro_batch_size=3, score_mask=resp)
    ((lp2 * w).sum() + h2.sum()).backward()
    assert_close(lp, lp2, atol=2e-5, rtol=1e-5)
    for a, b in zip(gathered, _grads(llama)):
        assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_an_empty_mask_scores_zero_and_backward_still_works(llama):
    ids, am, resp = _batch([5, 4], [2, 2], 7, seed=5)
    lp, h = token_logprobs_and_entropy(llama, ids, am, micro_batch_size=2, score_mask=torch.zeros_like(resp))
    assert (lp == 0).all() and (h == 0).all()
    (lp.sum() + h.sum()).backward()
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in llama.parameters())
    llama.zero_grad(set_to_none=True)


def test_score_mask_of_the_wrong_shape_is_a_named_error(llama):
    ids, am, resp = _batch([3], [2], 6)
    with pytest.raises(PolicyInputError, match="score_mask"):
        token_logprobs_and_entropy(llama, ids, am, micro_batch_size=1, score_mask=resp[:, :4])


def test_rows_are_scored_in_length_order_but_returned_in_input_order(llama):
    ids, am, resp = _batch([6, 2, 5, 3, 4], [3, 1, 4, 2, 0], 10, seed=6)
    with torch.no_grad():
        together = token_logprobs_and_entropy(llama, ids, am, micro_batch_size=5, score_mask=resp)
        sorted_in_pairs = token_logprobs_and_entropy(llama, ids, am, micro_batch_size=2, score_mask=resp)
    for a, b in zip(together, sorted_in_pairs):
        assert_close(a, b, atol=2e-5, rtol=1e-5)
