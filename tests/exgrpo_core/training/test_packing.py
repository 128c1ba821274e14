"""Padding-free packed micro-batches (issue 32 item 3): the same loss, statistics and step as padded
micro-batches; no host sync inside a micro-batch (a constant number per optimiser step); executed
tokens equal useful ones."""

import copy
from functools import partial

import pytest
import torch
from accelerate import Accelerator

from exgrpo_core.algorithm import losses
from exgrpo_core.models.build import build_tiny_model, build_tiny_tokenizer
from exgrpo_core.training import packing
from exgrpo_core.training.batch import collate, micro_batch_rows
from exgrpo_core.observe.host_syncs import counting
from exgrpo_core.training.optimise import optimise
from exgrpo_core.types import Rollout


def _setup(rows=8, kv_heads=2, seed=0):
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, seed=seed,
                             config_overrides={"num_key_value_heads": kv_heads})
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(rows):
        prompt = [1, 7 + i % 3, 9][: 2 + i % 2]
        resp = torch.randint(5, 40, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g).tolist()
        out.append(Rollout(f"q{i // 4}", prompt, resp, (-2.0 - 0.1 * torch.rand(len(resp), generator=g)).tolist(),
                           "", False, 0, replayed_from=5 if i % 4 == 3 else None))
    adv = [1.0, -1.0, 0.5, -0.5, 0.25, 1.0, -0.25, 0.75][:rows]
    return model, collate(out, adv, tok.pad_token_id, [i // 4 for i in range(rows)])


def _step(model, batch, micro, pack, aggregation="seq_sum_norm", lr=0.1):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    return optimise(model, opt, Accelerator(cpu=True), batch, n_minibatches=1, micro_batch_size=micro,
                    onpolicy_term=partial(losses.clipped_ratio_term, clip_eps=0.2),
                    replay_term=partial(losses.shaped_replay_term, beta=0.1), aggregation=aggregation,
                    max_response_len=8, entropy_coef=0.01, kl_coef=0.0, ref_model=None, max_grad_norm=1e9,
                    skip_grad_norm=None, pack=pack, share_prompts=False)


@pytest.mark.parametrize("aggregation", ["seq_sum_norm", "token_mean", "micro_sum_norm"])
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_packed_and_padded_give_the_same_loss_stats_and_step(aggregation, kv_heads):
    model, batch = _setup(kv_heads=kv_heads)
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    micro = 3 if aggregation != "micro_sum_norm" else 8  # micro_sum_norm: each micro-batch its own denominators
    sa, sb = _step(a, batch, micro, pack=False, aggregation=aggregation), _step(b, batch, micro, pack=True,
                                                                             aggregation=aggregation)
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sb[k] == pytest.approx(sa[k], rel=1e-4, abs=1e-6), k
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pb, pa, atol=1e-6, rtol=1e-5, msg=name)
    assert sa["loss/grad_norm"] > 0 and sa["loss/replay_tokens"] > 0


def test_packed_scores_equal_padded_scores_per_token():
    from exgrpo_core.training import policy

    model, batch = _setup()
    p = packing.pack(packing.row_spans(batch), "cpu")
    lp, h = packing.packed_logprobs_and_entropy(model, batch.input_ids[:, :p.width], p, with_entropy=True)
    lp2, h2 = policy.token_logprobs_and_entropy(model, batch.input_ids, batch.attention_mask, micro_batch_size=8,
                                                score_mask=batch.response_mask, share_prompts=False)
    torch.testing.assert_close(lp, lp2[:, :p.width], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h, h2[:, :p.width], atol=1e-5, rtol=1e-5)
    assert p.tokens == int(batch.attention_mask.sum())  # one packed sequence of real tokens only


def _syncs(micro, pack):
    model, batch = _setup()
    with counting() as c:
        _step(model, batch, micro, pack)
    return c.total


def test_host_syncs_per_optimiser_step_do_not_grow_with_micro_batches():
    packed = {m: _syncs(m, True) for m in (8, 2, 1)}  # 1, 4 and 8 micro-batches of the 8 rows
    assert len(set(packed.values())) == 1, packed
    padded = {m: _syncs(m, False) for m in (8, 1)}
    assert padded[1] == padded[8]  # padded: the rows' extents read once per mini-batch too (test_padded_syncs.py)


def test_executed_tokens_equal_useful_tokens_when_packed():
    _, batch = _setup()
    lengths = batch.attention_mask.sum(-1).tolist()
    padded = micro_batch_rows(batch, 3)
    packed = packing.micro_batches(lengths, 3)
    assert packing.executed_tokens(lengths, packed, packed=True) / sum(lengths) == 1.0
    assert packing.executed_tokens(lengths, padded, packed=False) / sum(lengths) > 1.0


def test_packed_micro_batches_cap_rows_and_real_tokens():
    assert packing.micro_batches([9, 3, 8, 2], 3, 12) == [[3, 1], [2], [0]]
    assert packing.micro_batches([9, 3, 8, 2], 2) == [[3, 1], [2, 0]]
    assert packing.micro_batches([20, 1], 4, 10) == [[1], [0]]  # a row over the cap goes alone


@pytest.mark.gpu
def test_packed_varlen_attention_on_cuda_matches_padded_sdpa_in_bf16():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (torch's varlen FlashAttention)")
    from exgrpo_core.training import policy

    model, batch = _setup()
    model = model.to("cuda", torch.bfloat16)
    batch_ids = batch.input_ids.cuda()
    p = packing.pack(packing.row_spans(batch), "cuda")
    lp, h = packing.packed_logprobs_and_entropy(model, batch_ids[:, :p.width], p, with_entropy=True)
    lp.sum().backward()
    grads = {n: q.grad.clone() for n, q in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    lp2, h2 = policy.token_logprobs_and_entropy(model, batch_ids, batch.attention_mask.cuda(), micro_batch_size=8,
                                                score_mask=batch.response_mask.cuda(), share_prompts=False)
    lp2.sum().backward()
    torch.testing.assert_close(lp, lp2[:, :p.width], atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(h, h2[:, :p.width], atol=3e-2, rtol=3e-2)
    for n, q in model.named_parameters():
        torch.testing.assert_close(grads[n].float(), q.grad.float(), atol=5e-2, rtol=5e-2, msg=n)


def test_packed_step_under_gradient_checkpointing_equals_padded():
    model, batch = _setup()
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    for m in (a, b):
        (getattr(m, "activation_checkpointing_enable", None) or m.gradient_checkpointing_enable)()
    sa, sb = _step(a, batch, 3, pack=False), _step(b, batch, 3, pack=True)
    assert sb["loss/total"] == pytest.approx(sa["loss/total"], rel=1e-4, abs=1e-6)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pb, pa, atol=1e-6, rtol=1e-5, msg=name)
