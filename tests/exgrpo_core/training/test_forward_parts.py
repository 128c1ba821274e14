"""Rows that share a prompt run it once (forward_parts.shared_prompt_logits): same values, same gradients.

Run: .venv/bin/python -m pytest tests/exgrpo_core/test_forward_parts.py -q
"""

import pytest
import torch
from torch.testing import assert_close
from transformers import LlamaConfig, LlamaForCausalLM

from exgrpo_core.training.forward_parts import can_share_prompts
from exgrpo_core.training.policy import token_logprobs_and_entropy


@pytest.fixture()
def llama():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    return model


def _groups(left: bool):
    """Three questions (prompts of 5, 2 and 4 tokens) with 3, 1 and 2 responses of mixed lengths
    (one empty), shuffled; right- or left-padded rows and their response masks."""
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 50, (n,), generator=g).tolist() for n in (5, 2, 4)]
    rows = [(0, 3), (1, 2), (0, 1), (2, 4), (0, 5), (2, 0)]  # (question, response length)
    seqs = [(prompts[q], torch.randint(0, 50, (t,), generator=g).tolist()) for q, t in rows]
    width = max(len(p) + len(r) for p, r in seqs) + 1
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    am, resp = torch.zeros_like(ids), torch.zeros(ids.shape, dtype=torch.bool)
    for i, (p, r) in enumerate(seqs):
        start = width - len(p) - len(r) if left else 0
        ids[i, start:start + len(p) + len(r)] = torch.tensor(p + r)
        am[i, start:start + len(p) + len(r)] = 1
        resp[i, start + len(p):start + len(p) + len(r)] = True
    return ids, am, resp


def _embedded_tokens(model, fn):
    seen = []
    hook = model.get_input_embeddings().register_forward_hook(lambda _m, a, _o: seen.append(a[0].numel()))
    try:
        out = fn()
    finally:
        hook.remove()
    return out, sum(seen)


@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_shared_prompts_give_the_same_values_and_gradients(llama, left, temperature):
    ids, am, resp = _groups(left)
    w = torch.randn(ids.shape, generator=torch.Generator().manual_seed(2))
    results, grads, tokens = {}, {}, {}
    for share in (True, False):
        (lp, h), tokens[share] = _embedded_tokens(llama, lambda: token_logprobs_and_entropy(
            llama, ids, am, micro_batch_size=6, temperature=temperature, score_mask=resp, share_prompts=share))
        ((lp * w).sum() + (h * w.flip(1)).sum()).backward()
        results[share] = (lp.detach(), h.detach())
        grads[share] = [p.grad.clone() for p in llama.parameters()]
        llama.zero_grad(set_to_none=True)
    assert tokens[True] < tokens[False]  # the shared path ran (three prompt forwards, not six)
    for a, b in zip(results[True], results[False]):
        assert_close(a, b, atol=2e-5, rtol=1e-5)
    assert (results[True][0][~resp] == 0).all()
    for a, b in zip(grads[True], grads[False]):  # float32 rounding scales with the gradient (up to ~350 here)
        assert_close(a, b, atol=1e-6 * float(b.abs().max()), rtol=1e-4)


def test_distinct_prompts_take_the_plain_path(llama):
    ids, am, resp = _groups(False)
    keep = [0, 1, 3]  # one row per question
    _, tokens = _embedded_tokens(llama, lambda: token_logprobs_and_entropy(
        llama, ids[keep], am[keep], micro_batch_size=3, score_mask=resp[keep]))
    assert tokens == ids[keep].shape[0] * (int(am[keep].any(0).nonzero().max()) + 1)  # one forward of the grid


def test_not_shared_under_gradient_checkpointing_in_training(llama):
    assert can_share_prompts(llama)
    llama.gradient_checkpointing_enable()
    llama.train()
    assert not can_share_prompts(llama)
    llama.eval()
    assert can_share_prompts(llama)


def test_the_config_switch_reaches_the_trainer(tmp_path):
    from exgrpo_core.config_io import load_config
    from exgrpo_core.session import open_session

    for on in (True, False):
        cfg = load_config("tiny", [f"run.output_dir={tmp_path / str(on)}", "run.resume=never",
                                   f"run.db_url=sqlite:///{tmp_path / f'{on}.db'}", f"train.share_prompt_forward={on}"])
        s = open_session(cfg)
        try:
            assert s.team.worker.share_prompts is on
        finally:
            s.close()
