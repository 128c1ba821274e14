"""Loss terms: hand-worked numbers, a naive per-token loop reference, and properties.

Run: .venv/bin/python -m pytest tests/exgrpo_core/test_losses.py -q
"""

import math
from functools import partial

import pytest
import torch
from torch.testing import assert_close

from exgrpo_core.algorithm import losses as L
from exgrpo_core.metrics import declared

CLIP = partial(L.clipped_ratio_term, clip_eps=0.2)
SHAPE = partial(L.shaped_replay_term, beta=0.1)
TERMS = {"clipped": CLIP, "unclipped": L.unclipped_ratio_term, "shaped": SHAPE, "plain": L.plain_replay_term}


def _logs(*ratios):
    return torch.log(torch.tensor([list(ratios)], dtype=torch.float64))


# ---------------------------------------------------------------- (a) hand-worked
def test_clipped_term_hand_worked():
    # r = [.5, 1, 1.5], eps = .2 -> clip(r) = [.8, 1, 1.2]
    # A = +1: -min([.5, 1, 1.5], [.8, 1, 1.2]) = [-.5, -1, -1.2]
    # A = -1: -min([-.5, -1, -1.5], [-.8, -1, -1.2]) = [.8, 1, 1.5]
    logp, old = _logs(0.5, 1.0, 1.5).repeat(2, 1), torch.zeros(2, 3, dtype=torch.float64)
    out = CLIP(logp, old, torch.tensor([1.0, -1.0], dtype=torch.float64))
    assert_close(out, torch.tensor([[-0.5, -1.0, -1.2], [0.8, 1.0, 1.5]], dtype=torch.float64))
    # unclipped: -r A = [-.5, -1, -1.5] for A = +1
    assert_close(L.unclipped_ratio_term(logp[:1], old[:1], torch.ones(1, dtype=torch.float64)),
                 torch.tensor([[-0.5, -1.0, -1.5]], dtype=torch.float64))


def test_replay_terms_hand_worked():
    # w = [1, .1, .9], beta = .1 -> f = [1/1.1, .1/.2, .9/1.0] = [.90909, .5, .9]; A = 2 -> -2 f
    logp, beh, adv = _logs(1.0, 0.1, 0.9), torch.zeros(1, 3, dtype=torch.float64), torch.tensor([2.0]).double()
    assert_close(SHAPE(logp, beh, adv), torch.tensor([[-2 / 1.1, -1.0, -1.8]], dtype=torch.float64))
    # plain: -A w = [-2, -.2, -1.8]
    assert_close(L.plain_replay_term(logp, beh, adv), torch.tensor([[-2.0, -0.2, -1.8]], dtype=torch.float64))


def test_kl_entropy_aggregate_hand_worked():
    # d = ref - logp = [0, log 2] -> k3 = [1 - 0 - 1, 2 - .693147 - 1] = [0, .306853]
    kl = L.kl_k3_term(torch.tensor([[0.0, math.log(0.5)]]), torch.zeros(1, 2))
    assert_close(kl, torch.tensor([[0.0, 1.0 - math.log(2.0)]]))
    assert_close(L.entropy_bonus_term(torch.tensor([[0.3, 1.2]])), torch.tensor([[-0.3, -1.2]]))
    # (1 + 2 + 4) / 3 with masked 3, 5, 6
    tok = torch.tensor([[1.0, 2, 3], [4, 5, 6]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    assert L.aggregate(tok, mask, 3.0).item() == pytest.approx(7 / 3)
    assert L.token_mean_denominator(mask) == 3.0
    # a float mask weights tokens: (1 * 1 + .5 * 2 + 0 * inf) / 2 = 1
    half = L.aggregate(torch.tensor([[1.0, 2.0, float("inf")]]), torch.tensor([[1.0, 0.5, 0.0]]), 2.0)
    assert half.item() == 1.0
    assert L.seq_sum_norm_denominator(2, 8) == 16.0


def test_mixed_policy_loss_hand_worked():
    # row 0 on-policy, A = 1, r = [1.5, .5] -> clipped term [-1.2, -.5]; clipping active on token 0
    # row 1 replayed, A = 1, w = [1, .1] -> shaped term [-1/1.1, -.5]; token 1 masked out
    # denominator 4 (2 rows x max length 2): on = -1.7 / 4 = -.425, off = -.909091 / 4 = -.227273
    logp = torch.log(torch.tensor([[1.5, 0.5], [1.0, 0.1]]))
    mask = torch.tensor([[True, True], [True, False]])
    loss, stats = L.mixed_policy_loss(
        logp, torch.zeros(2, 2), torch.ones(2), mask, torch.tensor([False, True]),
        onpolicy_term=CLIP, replay_term=SHAPE, denominator=L.seq_sum_norm_denominator(2, 2))
    assert loss.item() == pytest.approx(-0.425 - 0.25 / 1.1, rel=1e-6)
    assert stats["loss/onpolicy"] == pytest.approx(-0.425, rel=1e-6)
    assert stats["loss/offpolicy"] == pytest.approx(-0.25 / 1.1, rel=1e-6)
    assert stats["loss/clipfrac"] == pytest.approx(0.5)  # 1 of 2 on-policy tokens
    assert stats["loss/iw_mean"] == pytest.approx(1.0) and stats["loss/iw_var"] == pytest.approx(0.0, abs=1e-12)
    assert stats["loss/shaped_iw_mean"] == pytest.approx(1 / 1.1, rel=1e-6)
    assert (stats["loss/replay_tokens"], stats["loss/onpolicy_tokens"]) == (1.0, 2.0)
    assert len(stats) == 12 and all(declared(k, 8) for k in stats)  # the metrics contract


def _two_forms(aggregation: str, ranks: int = 1):
    # rows: on-policy A = 1, 2 tokens; on-policy A = -.5, 1 token (the second masked); ratio 1 everywhere
    # entropies [.5, 1] and [2, masked 9]; entropy_coef .1; max response length 4
    mask = torch.tensor([[True, True], [True, False]])
    if aggregation == "seq_sum_norm":
        denom, mean_denom = L.seq_sum_norm_denominator(2, 4), None
    else:
        denom, mean_denom = L.micro_sum_norm_denominators(mask, 4, ranks)
    return L.mixed_policy_loss(
        torch.zeros(2, 2), torch.zeros(2, 2), torch.tensor([1.0, -0.5]), mask, torch.tensor([False, False]),
        onpolicy_term=L.unclipped_ratio_term, replay_term=SHAPE, denominator=denom,
        entropy_tok=torch.tensor([[0.5, 1.0], [2.0, 9.0]]), entropy_coef=0.1, mean_denominator=mean_denom)


def test_dr_grpo_aggregation_hand_worked():
    # pg tokens -1, -1, +.5 -> sum -1.5; entropy sum 3.5; both / (2 rows x 4) = 8
    # loss = -1.5 / 8 - .1 x 3.5 / 8 = -.1875 - .04375 = -.23125
    loss, stats = _two_forms("seq_sum_norm")
    assert loss.item() == pytest.approx(-0.23125, rel=1e-6)
    assert stats["loss/onpolicy"] == pytest.approx(-0.1875, rel=1e-6)


def test_authors_micro_batch_aggregation_hand_worked():
    # (code) sum(pg) / max_len - coef x token-mean entropy: -1.5 / 4 - .1 x 3.5 / 3 = -.375 - .116667
    loss, stats = _two_forms("micro_sum_norm")
    assert loss.item() == pytest.approx(-0.375 - 0.35 / 3, rel=1e-6)
    assert stats["loss/onpolicy"] == pytest.approx(-0.375, rel=1e-6)
    assert stats["loss/entropy"] == pytest.approx(3.5 / 3, rel=1e-6)
    # averaged over 2 ranks: each rank's loss is halved
    assert _two_forms("micro_sum_norm", ranks=2)[0].item() == pytest.approx((-0.375 - 0.35 / 3) / 2, rel=1e-6)
    assert L.micro_sum_norm_denominators(torch.tensor([[1, 1, 0], [1, 0, 0]]), 4, 1) == (4.0, 3.0)
    with pytest.raises(L.LossInputError, match="ranks"):
        L.micro_sum_norm_denominators(torch.ones(1, 1), 4, 0)


# ---------------------------------------------------------------- (b) naive loop reference
def _naive_term(name, logp, old, adv):
    out = torch.zeros_like(logp)
    for n in range(logp.shape[0]):
        a = adv[n].item()
        for t in range(logp.shape[1]):
            w = math.exp(logp[n, t].item() - old[n, t].item())
            out[n, t] = {"clipped": -min(w * a, min(max(w, 0.8), 1.2) * a), "unclipped": -w * a,
                         "shaped": -a * w / (w + 0.1), "plain": -a * w}[name]
    return out


def _random_batch(n=6, t=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(n, t, generator=g, dtype=torch.float64) * 3
    old = logp + torch.randn(n, t, generator=g, dtype=torch.float64) * 0.4
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    mask = torch.rand(n, t, generator=g) < 0.7
    return logp, old, adv, mask


@pytest.mark.parametrize("name", list(TERMS))
def test_terms_match_naive_loop(name):
    logp, old, adv, _ = _random_batch()
    assert_close(TERMS[name](logp, old, adv), _naive_term(name, logp, old, adv))


def test_mixed_policy_loss_matches_naive_loop():
    logp, old, adv, mask = _random_batch(seed=3)
    ref, ent = logp - 0.1, torch.rand_like(logp)
    is_replay = torch.tensor([False, True, False, True, True, False])
    loss, stats = L.mixed_policy_loss(logp, old, adv, mask, is_replay, onpolicy_term=CLIP, replay_term=SHAPE,
                                      denominator=7.0, entropy_tok=ent, entropy_coef=0.01, ref_logp=ref,
                                      kl_coef=0.05)
    on, rep, tot, ws = 0.0, 0.0, 0.0, []
    clip_tok = _naive_term("clipped", logp, old, adv)
    shaped_tok = _naive_term("shaped", logp, old, adv)
    for n in range(6):
        for t in range(9):
            if not mask[n, t]:
                continue
            d = ref[n, t].item() - logp[n, t].item()
            tot += -0.01 * ent[n, t].item() + 0.05 * (math.exp(d) - d - 1)
            if is_replay[n]:
                rep += shaped_tok[n, t].item()
                ws.append(math.exp(logp[n, t].item() - old[n, t].item()))
            else:
                on += clip_tok[n, t].item()
    assert loss.item() == pytest.approx((tot + on + rep) / 7.0, rel=1e-9)
    assert stats["loss/onpolicy"] == pytest.approx(on / 7.0, rel=1e-9)
    assert stats["loss/offpolicy"] == pytest.approx(rep / 7.0, rel=1e-9)
    mean = sum(ws) / len(ws)
    assert stats["loss/iw_mean"] == pytest.approx(mean) and stats["loss/iw_max"] == pytest.approx(max(ws))
    assert stats["loss/iw_var"] == pytest.approx(sum((w - mean) ** 2 for w in ws) / len(ws))
    assert stats["loss/shaped_iw_mean"] == pytest.approx(sum(w / (w + 0.1) for w in ws) / len(ws))
    assert stats["loss/replay_tokens"] == len(ws)


# ---------------------------------------------------------------- (c) properties
def _grad(term, logp, old, adv, mask=None, denom=1.0):
    logp = logp.clone().requires_grad_(True)
    mask = torch.ones_like(logp, dtype=torch.bool) if mask is None else mask
    (g,) = torch.autograd.grad(L.aggregate(term(logp, old, adv), mask, denom), logp)
    return g


@pytest.mark.parametrize("name", list(TERMS))
def test_masked_tokens_get_exactly_zero_gradient(name):
    logp, old, adv, mask = _random_batch(seed=5)
    old = torch.where(mask, old, torch.full_like(old, -1e4))  # garbage behaviour log-probs on pads
    g = _grad(TERMS[name], logp, old, adv, mask)
    assert torch.isfinite(g).all()
    assert torch.equal(g[~mask], torch.zeros_like(g[~mask]))
    assert (g[mask & (adv[:, None] != 0)] != 0).any()


def test_mixed_loss_masked_tokens_get_zero_gradient():
    logp, old, adv, mask = _random_batch(seed=6)
    logp = logp.requires_grad_(True)
    loss, _ = L.mixed_policy_loss(logp, old, adv, mask, torch.arange(6) % 2 == 0, onpolicy_term=CLIP,
                                  replay_term=SHAPE, denominator=5.0, entropy_tok=torch.rand_like(logp),
                                  entropy_coef=0.1, ref_logp=logp.detach() - 0.2, kl_coef=0.1)
    (g,) = torch.autograd.grad(loss, logp)
    assert torch.equal(g[~mask], torch.zeros_like(g[~mask])) and (g[mask] != 0).all()


def test_shaping_is_monotone_with_known_value_and_gradient_at_one():
    beta = 0.1
    w = torch.linspace(0.01, 20, 500, dtype=torch.float64)
    f = -SHAPE(torch.log(w)[None], torch.zeros(1, 500, dtype=torch.float64), torch.ones(1, dtype=torch.float64))
    assert (f[0, 1:] > f[0, :-1]).all()
    one = torch.zeros(1, 1, dtype=torch.float64)  # log w = 0
    assert -SHAPE(one, one, torch.ones(1, dtype=torch.float64)).item() == pytest.approx(1 / (1 + beta))
    g = _grad(SHAPE, torch.zeros(1, 1, dtype=torch.float64), torch.zeros(1, 1, dtype=torch.float64),
              torch.ones(1, dtype=torch.float64))
    # d(-f(w))/dlogp = -beta w / (w + beta)^2 = -0.1 / 1.21 = -0.0826 at w = 1
    assert g.item() == pytest.approx(-beta / (1 + beta) ** 2) and -g.item() == pytest.approx(0.083, abs=5e-4)
    # the unshaped weight has gradient w = 1 there: shaping shrinks it ~12x
    assert _grad(L.plain_replay_term, torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1)).item() == -1.0


def test_shaping_is_finite_for_huge_weights():
    out = SHAPE(torch.tensor([[80.0, -80.0]]), torch.zeros(1, 2), torch.ones(1))
    assert torch.isfinite(out).all() and out[0, 0].item() == pytest.approx(-1.0)


@pytest.mark.parametrize("ratio, a, zero", [(1.5, 1.0, True), (0.5, 1.0, False), (0.5, -1.0, True),
                                            (1.5, -1.0, False), (1.1, 1.0, False), (0.9, -1.0, False)])
def test_clipping_zeroes_gradient_outside_range_in_direction_of_a(ratio, a, zero):
    g = _grad(CLIP, torch.tensor([[math.log(ratio)]]), torch.zeros(1, 1), torch.tensor([a]))
    assert (g.item() == 0.0) == zero


@pytest.mark.parametrize("agg", ["token_mean", "seq_sum_norm"])
def test_denominators_are_exact_under_micro_batch_splitting(agg):
    logp, old, adv, mask = _random_batch(n=8, t=7, seed=7)
    is_replay = torch.arange(8) >= 5
    denom = L.token_mean_denominator(mask) if agg == "token_mean" else L.seq_sum_norm_denominator(8, 7)
    kw = dict(onpolicy_term=CLIP, replay_term=SHAPE, denominator=denom)
    full, _ = L.mixed_policy_loss(logp, old, adv, mask, is_replay, **kw)
    parts = [L.mixed_policy_loss(logp[s], old[s], adv[s], mask[s], is_replay[s], **kw)[0]
             for s in (slice(0, 3), slice(3, 4), slice(4, 8))]
    assert_close(sum(parts), full, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", list(TERMS))
def test_minimising_increases_logp_of_positive_advantage_tokens(name):
    logp, old = torch.full((2, 1), -1.0), torch.full((2, 1), -1.0)
    g = _grad(TERMS[name], logp, old, torch.tensor([1.0, -1.0]))
    assert g[0].item() < 0 < g[1].item()  # a descent step raises logp where A > 0, lowers it where A < 0


def test_stats_are_nan_free_without_replayed_tokens():
    logp, old, adv, mask = _random_batch(seed=9)
    _, stats = L.mixed_policy_loss(logp, old, adv, mask, torch.zeros(6, dtype=torch.bool),
                                   onpolicy_term=L.unclipped_ratio_term, replay_term=SHAPE, denominator=1.0)
    assert all(math.isfinite(v) for v in stats.values())
    assert stats["loss/iw_mean"] == stats["loss/iw_max"] == stats["loss/replay_tokens"] == 0.0
    assert stats["loss/offpolicy"] == 0.0 and stats["loss/clipfrac"] == 0.0  # no clipping when unclipped


def test_bad_inputs_raise_named_errors():
    logp, old, adv, mask = _random_batch()
    kw = dict(onpolicy_term=CLIP, replay_term=SHAPE, denominator=1.0)
    rep = torch.zeros(6, dtype=torch.bool)
    with pytest.raises(L.LossInputError, match="old_logp"):
        L.mixed_policy_loss(logp, old[:, :3], adv, mask, rep, **kw)
    with pytest.raises(L.LossInputError, match="adv"):
        L.mixed_policy_loss(logp, old, adv[:2], mask, rep, **kw)
    with pytest.raises(L.LossInputError, match="ref_logp"):
        L.mixed_policy_loss(logp, old, adv, mask, rep, kl_coef=0.1, **kw)
    with pytest.raises(L.LossInputError, match="entropy_tok"):
        L.mixed_policy_loss(logp, old, adv, mask, rep, entropy_coef=0.1, **kw)
    with pytest.raises(L.LossInputError, match="denominator"):
        L.aggregate(logp, mask, 0.0)
    with pytest.raises(L.LossInputError, match="max_response_len"):
        L.seq_sum_norm_denominator(4, 0)


def test_the_entropy_mean_is_taken_over_the_authors_micro_batches():
    """verl's dynamic micro-batches of <= 32,768 tokens: 40,000 tokens make 2; their 3,000 response tokens
    count 1 / 1,500 each (1 / 3,000 per rank-averaged mean with 2 ranks), whatever our memory micro-batches."""
    assert L.virtual_micro_denominator(3000, 40000, 32768, 1) == 1500.0
    assert L.virtual_micro_denominator(3000, 40000, 32768, 2) == 3000.0
    assert L.virtual_micro_denominator(3000, 32768, 32768, 1) == 3000.0  # exactly one micro-batch
    assert L.virtual_micro_denominator(0, 10, 32768, 1) == 1.0  # no response token: no division by zero
    entropy = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    # 3 response tokens of 65,537 tokens -> k = 3 authors' micro-batches: 3 x the token mean 2.0
    assert float(L.aggregate(entropy, mask, L.virtual_micro_denominator(3, 65537, 32768, 1))) == pytest.approx(6.0)
    with pytest.raises(L.LossInputError):
        L.virtual_micro_denominator(3, 10, 0, 1)


# ---------------------------------------------------------------- loss.replay_old_logprobs (paper Table 6)
def _replayed_batch():
    logp = torch.log(torch.tensor([[0.3, 0.6, 0.9], [0.2, 0.5, 0.7]], dtype=torch.float64)).requires_grad_(True)
    stored = torch.log(torch.tensor([[0.1, 0.9, 0.4], [0.6, 0.25, 0.7]], dtype=torch.float64))  # w != 1
    adv = torch.tensor([1.0, -0.5], dtype=torch.float64)
    mask = torch.ones(2, 3, dtype=torch.float64)
    return logp, stored, adv, mask, torch.tensor([True, True])


def _replay_grad(source, replay=SHAPE):
    logp, stored, adv, mask, is_replay = _replayed_batch()
    loss, stats = L.mixed_policy_loss(logp, stored, adv, mask, is_replay, onpolicy_term=CLIP,
                                      replay_term=L.replay_behaviour(replay, source),
                                      denominator=L.token_mean_denominator(mask))
    loss.backward()
    return logp.grad, stats, logp.detach(), stored, adv


def test_current_behaviour_logprobs_give_weight_exactly_one():
    logp, stored, adv, _, _ = _replayed_batch()
    term = L.replay_behaviour(SHAPE, "current")
    # the term's applied weight -term(.., A = 1) is f(1) = 1 / 1.1 on every token, whatever was stored
    assert torch.equal(-term(logp, stored, torch.ones(2, dtype=torch.float64)),
                       torch.full((2, 3), 1 / 1.1, dtype=torch.float64))
    assert torch.equal(-L.replay_behaviour(L.plain_replay_term, "current")(logp, stored, torch.ones(2, dtype=torch.float64)),
                       torch.ones(2, 3, dtype=torch.float64))


def test_current_behaviour_gradient_is_the_shaped_term_at_w_one():
    grad, stats, _, _, adv = _replay_grad("current")
    # d(-A f(w))/d logp = -A beta w / (w + beta)^2 = -A * 0.1 / 1.21 = -A * 0.0826 at w = 1, token mean / 6
    per_token = 0.1 / 1.1 ** 2
    assert per_token == pytest.approx(0.0826, abs=1e-4)
    assert_close(grad, (-adv[:, None] * per_token / 6).expand(2, 3))
    assert stats["loss/shaped_iw_mean"] == pytest.approx(1 / 1.1)


def test_recorded_behaviour_logprobs_are_todays_loss():
    grad, _, logp, stored, adv = _replay_grad("recorded")
    w = torch.exp(logp - stored)
    assert_close(grad, -adv[:, None] * 0.1 * w / (w + 0.1) ** 2 / 6)
    assert L.replay_behaviour(SHAPE, "recorded") is SHAPE
    with pytest.raises(L.LossInputError, match="unknown replay_old_logprobs"):
        L.replay_behaviour(SHAPE, "sampler")
