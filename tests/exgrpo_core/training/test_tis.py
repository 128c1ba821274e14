"""Truncated importance sampling for fresh rollouts whose sampler is not the trainer (loss.tis_cap).

The weights are min(pi_trainer / pi_sampler, cap) on fresh rollouts' response tokens and 1 elsewhere;
they scale the on-policy term token by token, leave the replay term and the clip statistics alone.
"""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch

from exgrpo_core.algorithm import losses as L
from exgrpo_core.training.batch import collate, select_rows
from exgrpo_core.types import Rollout

CLIP = partial(L.clipped_ratio_term, clip_eps=0.2)
SHAPE = partial(L.shaped_replay_term, beta=0.1)


def _rows():
    fresh = Rollout("a", [1, 2], [5, 6, 7], [-1.0, -2.0, -0.5], "", False, 0,
                    sampler_logprobs=[-1.5, -1.0, -0.5])  # ratios e^0.5, e^-1, 1
    unscored = Rollout("a", [1], [5, 6], [-1.0, -1.0], "", False, 0)  # sampler is the trainer: no weights
    replayed = Rollout("b", [1, 2, 3], [8], [-3.0], "", False, 0, replayed_from=4, sampler_logprobs=[-9.0])
    return [fresh, unscored, replayed]


def test_weights_are_truncated_ratios_on_fresh_response_tokens_only():
    batch = collate(_rows(), [1.0, -1.0, 0.5], pad_id=0, tis_cap=1.5)
    w = batch.tis_weights
    assert w[0, 2:5].tolist() == pytest.approx([1.5, math.exp(-1.0), 1.0])  # e^0.5 = 1.65 capped at 1.5
    assert w[0, :2].tolist() == [1.0, 1.0]
    assert torch.all(w[1] == 1.0) and torch.all(w[2] == 1.0)
    assert select_rows(batch, [0]).tis_weights.tolist() == [w[0, :5].tolist()]
    assert collate(_rows(), [1.0, -1.0, 0.5], pad_id=0).tis_weights is None


def test_mismatched_sampler_logprobs_are_an_error():
    bad = Rollout("a", [1], [5, 6], [-1.0, -1.0], "", False, 0, sampler_logprobs=[-1.0])
    with pytest.raises(ValueError, match="1 sampler log-probs for 2 response tokens"):
        collate([bad], [1.0], pad_id=0, tis_cap=2.0)


def test_weights_scale_the_onpolicy_term_token_by_token():
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(3, 4, generator=g, dtype=torch.float64)
    old = logp + 0.3 * torch.randn(3, 4, generator=g, dtype=torch.float64)
    adv, mask = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64), torch.ones(3, 4, dtype=torch.bool)
    is_replay = torch.tensor([False, False, True])
    w = 0.5 + torch.rand(3, 4, generator=g, dtype=torch.float64)
    kw = dict(onpolicy_term=CLIP, replay_term=SHAPE, denominator=12.0)
    plain, s0 = L.mixed_policy_loss(logp, old, adv, mask, is_replay, **kw)
    weighted, s1 = L.mixed_policy_loss(logp, old, adv, mask, is_replay, onpolicy_weight=w, **kw)
    on = (CLIP(logp, old, adv) * w)[:2].sum() / 12.0
    assert s1["loss/onpolicy"] == pytest.approx(float(on))
    assert s1["loss/offpolicy"] == pytest.approx(s0["loss/offpolicy"])  # replayed rows untouched
    assert s1["loss/clipfrac"] == s0["loss/clipfrac"]
    assert float(weighted) != pytest.approx(float(plain))
    with pytest.raises(L.LossInputError, match="onpolicy_weight has shape"):
        L.mixed_policy_loss(logp, old, adv, mask, is_replay, onpolicy_weight=w[:, :2], **kw)
