"""Scoring runs the softmax `chunk_positions` at a time; the blocks' backward must build the [M, V] logits
gradient once, not a zero-filled [M, V] per block that autograd then adds up (on an H200 at the
Qwen2.5-0.5B shape: 15 fills and 14 adds of 9 GB, a third of an optimiser call's GPU time)."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from exgrpo_core.models.build import build_tiny_model, build_tiny_tokenizer
from exgrpo_core.training import packing, policy
from exgrpo_core.training.batch import collate
from exgrpo_core.types import Rollout


class FullSized(TorchDispatchMode):
    """Counts the operators that make a new tensor of `numel` elements (the [M, V] logits gradient's size;
    views of one are not counted)."""

    def __init__(self, numel: int):
        super().__init__()
        self.numel, self.ops = numel, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.numel() == self.numel and not func.is_view:
            self.ops.append(str(func))
        return out


def _batch(rows=8, seed=0):
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=4, intermediate_size=64, seed=seed)
    g = torch.Generator().manual_seed(seed)
    out = [Rollout(f"q{i}", [1, 7, 9], torch.randint(5, 40, (6,), generator=g).tolist(), [-2.0] * 6, "", False, 0)
           for i in range(rows)]
    return model, collate(out, [1.0] * rows, tok.pad_token_id, list(range(rows)))


def _full_sized_in_backward(model, score, scored: int) -> list[str]:
    lp, h = score()
    mode = FullSized(scored * model.config.vocab_size)
    with mode:
        (lp.sum() + h.sum()).backward()
    return mode.ops


def test_padded_scoring_in_blocks_builds_the_logits_gradient_once():
    model, b = _batch()
    scored = int(b.response_mask.sum())  # 48 positions in blocks of 5: 10 blocks
    ops = _full_sized_in_backward(model, lambda: policy.token_logprobs_and_entropy(
        model, b.input_ids, b.attention_mask, micro_batch_size=8, chunk_positions=5, score_mask=b.response_mask,
        share_prompts=False), scored)
    assert len(ops) <= 2, ops  # one concatenation (and the head's [1, M, V] output's), not two per block


def test_packed_scoring_in_blocks_builds_the_logits_gradient_once():
    model, b = _batch()
    p = packing.pack(packing.row_spans(b), "cpu")
    ops = _full_sized_in_backward(model, lambda: packing.packed_logprobs_and_entropy(
        model, b.input_ids[:, :p.width], p, with_entropy=True, chunk_positions=5), p.tgt.numel())
    assert len(ops) <= 2, ops


def test_blocks_give_the_same_gradient_as_one_block():
    model, b = _batch()
    grads = []
    for chunk in (5, 4096):
        lp, h = policy.token_logprobs_and_entropy(model, b.input_ids, b.attention_mask, micro_batch_size=8,
                                                  chunk_positions=chunk, score_mask=b.response_mask,
                                                  share_prompts=False)
        (lp.sum() - 0.1 * h.sum()).backward()
        grads.append([q.grad.clone() for q in model.parameters()])
        model.zero_grad(set_to_none=True)
    for a, c in zip(*grads):
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-6)
