"""The padded training step without a host sync per micro-batch (issue 32 item 3): with the rows' spans and
prompts read once per mini-batch (`policy.HostRows`), a micro-batch's forward reads nothing back, and the
losses, statistics and gradients are bit for bit those of the device-read path."""

import copy
from functools import partial

import pytest
import torch
from accelerate import Accelerator

from exgrpo_core.algorithm import losses
from exgrpo_core.observe.host_syncs import counting
from exgrpo_core.training import packing, policy
from exgrpo_core.training.forward_parts import batch_prompts
from exgrpo_core.training.optimise import optimise
from test_packing import _setup


def _step(model, batch, micro, share, entropy=0.01):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return optimise(model, opt, Accelerator(cpu=True), batch, n_minibatches=1, micro_batch_size=micro,
                    onpolicy_term=partial(losses.clipped_ratio_term, clip_eps=0.2),
                    replay_term=partial(losses.shaped_replay_term, beta=0.1), aggregation="seq_sum_norm",
                    max_response_len=8, entropy_coef=entropy, kl_coef=0.0, ref_model=None, max_grad_norm=1e9,
                    skip_grad_norm=None, share_prompts=share)


@pytest.mark.parametrize("share", [False, True])
def test_host_syncs_per_optimiser_step_are_a_constant_on_the_padded_path(share):
    counts = {}
    for micro in (8, 2, 1):  # 1, 4 and 8 micro-batches of the 8 rows
        model, batch = _setup()
        with counting() as c:
            _step(model, batch, micro, share)
        counts[micro] = c.total
    assert len(set(counts.values())) == 1, counts
    assert counts[1] <= (7 if share else 4), counts


@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("micro", [8, 3, 1])
def test_the_host_read_path_gives_bit_identical_steps(monkeypatch, share, micro):
    model, batch = _setup()
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    sa = _step(a, batch, micro, share)
    monkeypatch.setattr(policy, "HostRows", lambda *args: None)  # every micro-batch read on the device, as before
    sb = _step(b, batch, micro, share)
    assert sa == sb
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(pa, pb), name


@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("left", [False, True])
def test_scores_and_gradients_from_host_spans_equal_the_device_read(share, left):
    """Right- and left-padded rows, rows of one length (no mask passed), rows with nothing scored."""
    model, batch = _setup()
    ids, am, rm = batch.input_ids, batch.attention_mask, batch.response_mask
    if left:  # move every row's tokens to the right edge
        shift = (am.shape[1] - am.sum(-1)).tolist()
        ids, am, rm = (torch.stack([x[i].roll(s) for i, s in enumerate(shift)]) for x in (ids, am, rm))
    rm = rm.clone()
    rm[2] = 0  # nothing scored in this row

    class Batch:
        attention_mask, response_mask = am, rm

    cases = [(ids, am, rm), (ids[:1], am[:1], rm[:1])]  # (a single row: no padding at all)
    for i, m, r in cases:
        host = policy.HostRows(packing.row_spans(Batch) if i.shape[0] == ids.shape[0] else
                               packing.row_spans(type("One", (), {"attention_mask": m, "response_mask": r})),
                               batch_prompts(i, m, r) if share else None)
        got = []
        for h in (host, None):
            model.zero_grad(set_to_none=True)
            lp, ent = policy.token_logprobs_and_entropy(model, i, m, micro_batch_size=8, score_mask=r,
                                                        share_prompts=share, host=h)
            (lp.sum() + ent.sum()).backward()
            got.append((lp, ent, [p.grad.clone() for p in model.parameters()]))
        (lp1, e1, g1), (lp2, e2, g2) = got
        assert torch.equal(lp1, lp2) and torch.equal(e1, e2)
        assert all(torch.equal(x, y) for x, y in zip(g1, g2))
        assert lp1.abs().sum() > 0


def test_row_spans_refuse_a_mask_with_holes():
    _, batch = _setup()
    holed = batch.attention_mask.clone()
    holed[0, 1] = 0
    with pytest.raises(policy.PolicyInputError, match="holes"):
        packing.row_spans(type("B", (), {"attention_mask": holed, "response_mask": batch.response_mask}))
