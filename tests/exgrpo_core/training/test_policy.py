"""Token log-probs / entropies from a causal LM, and trajectory entropy H(o).

Run: .venv/bin/python -m pytest tests/exgrpo_core/test_policy.py -q
"""

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.testing import assert_close
from transformers import LlamaConfig, LlamaForCausalLM

from exgrpo_core.training.policy import (PolicyInputError, token_logprobs_and_entropy, trajectory_entropy,
                                trajectory_nll)


@pytest.fixture(scope="module")
def llama():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=64)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # random init is nearly uniform over the vocabulary; sharpen it
        model.lm_head.weight.mul_(30.0)
    return model


class Bigram(nn.Module):
    """Causal LM whose next-token logits depend only on the current token: logits = table[x_t]."""

    def __init__(self, table):
        super().__init__()
        self.table = nn.Parameter(torch.tensor(table))

    def forward(self, input_ids, attention_mask, position_ids, use_cache):
        return SimpleNamespace(logits=self.table[input_ids])


def _rows(lengths, width, seed=1, left=False):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 50, (len(lengths), width), generator=g)
    am = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, n in enumerate(lengths):
        (am[i, width - n:] if left else am[i, :n]).fill_(1)
    return ids, am


def _naive(model, row_ids, temperature=1.0):
    """Per-position loop over the unpadded row with a softmax over the full logits."""
    with torch.no_grad():
        logits = model(row_ids[None]).logits[0].double() / temperature  # [n, V]
    lp, h = [0.0], [0.0]
    for t in range(1, len(row_ids)):
        p = torch.softmax(logits[t - 1], -1)
        lp.append(math.log(p[row_ids[t]].item()))
        h.append(-sum(pv * math.log(pv) for pv in p.tolist() if pv > 0))
    return torch.tensor(lp, dtype=torch.float32), torch.tensor(h, dtype=torch.float32)


# ---------------------------------------------------------------- (a) hand-worked
def test_bigram_hand_worked():
    # token 0 -> logits [0, log 3] -> p = [.25, .75]; token 1 -> logits [0, 0] -> p = [.5, .5]
    # sequence [0, 1, 1, pad]: pos 0 -> 0; pos 1 (1 after 0): log .75 = -.28768, H = -(.25 ln .25 +
    # .75 ln .75) = .56234; pos 2 (1 after 1): log .5 = -.69315, H = ln 2 = .69315; pad -> 0
    model = Bigram([[0.0, math.log(3.0)], [0.0, 0.0]])
    lp, h = token_logprobs_and_entropy(model, torch.tensor([[0, 1, 1, 0]]), torch.tensor([[1, 1, 1, 0]]),
                                       micro_batch_size=4)
    assert_close(lp, torch.tensor([[0.0, math.log(0.75), math.log(0.5), 0.0]]))
    assert_close(h, torch.tensor([[0.0, 0.56233514, math.log(2.0), 0.0]]))


def test_trajectory_entropy_and_nll_hand_worked():
    # response = positions 1, 2: H(o) = (1 + 2) / 2 = 1.5; prompt 9 and pad 5 ignored
    assert_close(trajectory_entropy(torch.tensor([[9.0, 1, 2, 5]]), torch.tensor([[False, True, True, False]])),
                 torch.tensor([1.5]))
    # NLL = -(-1 - 3) / 2 = 2
    assert_close(trajectory_nll(torch.tensor([[-7.0, -1, -3, 0]]), torch.tensor([[0, 1, 1, 0]])),
                 torch.tensor([2.0]))


# ---------------------------------------------------------------- (b) naive reference
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_right_padded_batch_matches_naive_unpadded_loop(llama, temperature):
    lengths = [9, 4, 7, 2, 9]
    ids, am = _rows(lengths, 9)
    with torch.no_grad():
        lp, h = token_logprobs_and_entropy(llama, ids, am, micro_batch_size=2, temperature=temperature,
                                           chunk_positions=3)
    for i, n in enumerate(lengths):
        ref_lp, ref_h = _naive(llama, ids[i, :n], temperature)
        assert_close(lp[i, :n], ref_lp, atol=2e-5, rtol=1e-5)
        assert_close(h[i, :n], ref_h, atol=2e-5, rtol=1e-5)
        assert (lp[i, n:] == 0).all() and (h[i, n:] == 0).all()
    assert h[:, 1:].std() > 0.1  # the sharpened model is far from uniform: the test can tell rows apart


def test_left_padding_gives_the_same_values_as_right_padding(llama):
    lengths = [6, 3, 5]
    ids_r, am_r = _rows(lengths, 6, seed=2)
    ids_l, am_l = torch.zeros_like(ids_r), torch.zeros_like(am_r)
    for i, n in enumerate(lengths):  # same tokens, moved to the right end
        ids_l[i, 6 - n:], am_l[i, 6 - n:] = ids_r[i, :n], 1
    with torch.no_grad():
        lp_r, h_r = token_logprobs_and_entropy(llama, ids_r, am_r, micro_batch_size=3)
        lp_l, h_l = token_logprobs_and_entropy(llama, ids_l, am_l, micro_batch_size=3)
    for i, n in enumerate(lengths):
        assert_close(lp_l[i, 6 - n:], lp_r[i, :n], atol=2e-5, rtol=1e-5)
        assert_close(h_l[i, 6 - n:], h_r[i, :n], atol=2e-5, rtol=1e-5)
    assert torch.isfinite(lp_l).all() and (lp_l[am_l == 0] == 0).all()


def test_trajectory_entropy_matches_naive_loop():
    g = torch.Generator().manual_seed(3)
    ent, mask = torch.rand(7, 11, generator=g), torch.rand(7, 11, generator=g) < 0.6
    expected = []
    for i in range(7):
        vals = [ent[i, t].item() for t in range(11) if mask[i, t]]
        expected.append(sum(vals) / len(vals) if vals else 0.0)
    assert_close(trajectory_entropy(ent, mask), torch.tensor(expected))


# ---------------------------------------------------------------- (c) properties
def test_padding_does_not_change_trajectory_entropy():
    # the authors' bug: a mean that counts padding shrinks H(o) of short rows
    ent = torch.tensor([[0.5, 2.0, 4.0]])
    mask = torch.tensor([[False, True, True]])
    padded_ent = torch.cat([ent, torch.full((1, 5), 7.0)], dim=1)  # garbage entropies on pads
    padded_mask = torch.cat([mask, torch.zeros(1, 5, dtype=torch.bool)], dim=1)
    assert trajectory_entropy(padded_ent, padded_mask).item() == trajectory_entropy(ent, mask).item() == 3.0
    buggy = (torch.where(padded_mask, padded_ent, 0.0).sum() / padded_mask.shape[1]).item()
    assert buggy != 3.0


def test_micro_batch_and_chunk_sizes_do_not_change_results(llama):
    ids, am = _rows([8, 5, 3, 8], 8, seed=4)
    with torch.no_grad():
        lp1, h1 = token_logprobs_and_entropy(llama, ids, am, micro_batch_size=1, chunk_positions=2)
        lp4, h4 = token_logprobs_and_entropy(llama, ids, am, micro_batch_size=4)
    assert_close(lp1, lp4, atol=2e-5, rtol=1e-5)
    assert_close(h1, h4, atol=2e-5, rtol=1e-5)


def test_runs_under_the_callers_grad_mode(llama):
    ids, am = _rows([5, 3], 5, seed=5)
    with torch.no_grad():
        lp, h = token_logprobs_and_entropy(llama, ids, am, micro_batch_size=2)
    assert not lp.requires_grad and not h.requires_grad
    lp, h = token_logprobs_and_entropy(llama, ids, am, micro_batch_size=1)
    assert lp.requires_grad and h.requires_grad
    (lp.sum() + h.sum()).backward()
    grads = [p.grad for p in llama.parameters()]
    assert all(gr is not None and torch.isfinite(gr).all() for gr in grads)
    llama.zero_grad(set_to_none=True)
    lp, h = token_logprobs_and_entropy(llama, ids, am, micro_batch_size=2, with_entropy=False)
    assert h is None and lp.shape == (2, 5)


def test_entropy_is_between_zero_and_log_vocab(llama):
    ids, am = _rows([7, 7], 7, seed=6)
    with torch.no_grad():
        _, h = token_logprobs_and_entropy(llama, ids, am, micro_batch_size=2)
    assert (h >= -1e-5).all() and (h <= math.log(50) + 1e-5).all()


@pytest.mark.parametrize("ids, am, kw, match", [
    (torch.zeros(2, 4, dtype=torch.long), torch.ones(2, 3), {}, "\\[N, L\\]"),
    (torch.zeros(1, 4, dtype=torch.long), torch.tensor([[1, 0, 1, 1]]), {}, "holes"),
    (torch.zeros(1, 4, dtype=torch.long), torch.ones(1, 4), {"micro_batch_size": 0}, "micro_batch_size"),
    (torch.zeros(1, 4, dtype=torch.long), torch.ones(1, 4), {"temperature": 0.0}, "temperature"),
])
def test_bad_inputs_raise_named_errors(ids, am, kw, match):
    model = Bigram([[0.0, 0.0], [0.0, 0.0]])
    with pytest.raises(PolicyInputError, match=match):
        token_logprobs_and_entropy(model, ids, am, **{"micro_batch_size": 2, **kw})
    with pytest.raises(PolicyInputError, match="response_mask"):
        trajectory_entropy(torch.zeros(2, 3), torch.zeros(2, 4, dtype=torch.bool))


def test_all_padding_row_scores_zero_and_keeps_gradients_finite(llama):
    ids, am = _rows([6, 0, 3], 6, seed=7, left=True)
    lp, h = token_logprobs_and_entropy(llama, ids, am, micro_batch_size=3)
    assert (lp[1] == 0).all() and (h[1] == 0).all() and (lp[2, :4] == 0).all()
    (lp.sum() + h.sum()).backward()
    assert all(torch.isfinite(p.grad).all() for p in llama.parameters())
    llama.zero_grad(set_to_none=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_fused_logprob_and_entropy_match_autograd(dtype, temperature):
    """`_block_scores` with entropy (hand-written backward) against the plain autograd formulas."""
    from exgrpo_core.training.policy import _block_scores

    g = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(6, 40, generator=g)).to(dtype)
    targets = torch.randint(0, 40, (6,), generator=g)
    wl, wh = torch.randn(6, generator=g), torch.randn(6, generator=g)
    out, grads = [], []
    for fused in (True, False):
        x = logits.clone().requires_grad_()
        if fused:
            lp, h = _block_scores(x, targets, temperature, True)
        else:
            y = x.float() / temperature
            lp = torch.log_softmax(y, -1).gather(-1, targets[:, None]).squeeze(-1)
            h = -(torch.softmax(y, -1) * torch.log_softmax(y, -1)).sum(-1)
        ((lp * wl).sum() + (h * wh).sum()).backward()
        out.append((lp.detach(), h.detach()))
        grads.append(x.grad)
    for a, b in zip(out[0], out[1]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert grads[0].dtype == dtype
    torch.testing.assert_close(grads[0].float(), grads[1].float(), atol=1e-5 if dtype == torch.float32 else 1e-2,
                               rtol=1e-4 if dtype == torch.float32 else 1e-2)
    assert float(grads[0].float().abs().max()) > 0.01
