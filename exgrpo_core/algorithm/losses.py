"""Token-level loss terms of ExGRPO's mixed-policy objective (paper Eq. 4-6).

On-policy rows use the PPO ratio term (clipped or not, chosen by the caller); replayed rows use policy
shaping f(w) = w / (w + beta) of the importance weight w = pi_theta / pi_behaviour. Deviations from
the paper, following the authors' code: no (1 - rho) / rho weights on the two parts (the batch mix is
the only weighting), and the default aggregation is sum over tokens / (rows * max response length)
(Dr.GRPO); the paper's token mean is `token_mean_denominator`; the authors' exact form (per
micro-batch sum / max length, entropy as the micro-batch's token mean, averaged over ranks) is
`micro_sum_norm_denominators`. Notation: N rows, T positions.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Callable

import torch

from exgrpo_core import metrics as M

# Log-ratios are clamped here before exp so that one wild token cannot give inf (and then NaN
# gradients through the masked-out branch); exp(20) ~ 4.9e8 is far past any useful weight.
_MAX_LOG_RATIO = 20.0

TokenTerm = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class LossInputError(ValueError):
    """Loss inputs with mismatched shapes or missing pieces (e.g. kl_coef > 0 without ref_logp)."""


def _log_ratio(logp: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    return (logp - old_logp).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)  # [N, T]


def clipped_ratio_term(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor,
                       clip_eps: float) -> torch.Tensor:
    """PPO clipped surrogate (GRPO Eq. 1): -min(r A, clip(r, 1 - eps, 1 + eps) A), r = exp(logp - old).

    Args:
        logp: [N, T] log pi_theta of the sampled tokens; old_logp: [N, T] log pi_old.
        adv: [N] advantage of each row, broadcast over its tokens.
        clip_eps: epsilon of the clip range.

    Returns:
        [N, T] per-token loss (not masked).
    """
    ratio = torch.exp(_log_ratio(logp, old_logp))  # [N, T]
    a = adv[:, None]  # [N, 1]
    return torch.maximum(-ratio * a, -ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps) * a)


def unclipped_ratio_term(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
    """Unclipped importance-sampled policy gradient (code, once replay is active): -r A.

    Returns [N, T]; arguments as `clipped_ratio_term`.
    """
    return -torch.exp(_log_ratio(logp, old_logp)) * adv[:, None]


def shaped_replay_term(logp: torch.Tensor, behaviour_logp: torch.Tensor, adv: torch.Tensor,
                       beta: float) -> torch.Tensor:
    """ExGRPO policy shaping (Eq. 6): -A f(w), f(w) = w / (w + beta), w = exp(logp - behaviour_logp).

    Computed as sigmoid(log w - log beta), which equals w / (w + beta) and cannot overflow. The
    gradient weight on log pi is beta w / (w + beta)^2: 0.0826 at w = 1 for beta = 0.1.

    Args:
        logp: [N, T] log pi_theta; behaviour_logp: [N, T] stored trainer log-probs at collection.
        adv: [N] advantages; beta: shaping constant (paper: 0.1).

    Returns:
        [N, T] per-token loss (not masked).
    """
    if beta <= 0:
        raise LossInputError(f"shaping beta must be > 0, got {beta}")
    return -torch.sigmoid(_log_ratio(logp, behaviour_logp) - math.log(beta)) * adv[:, None]


def plain_replay_term(logp: torch.Tensor, behaviour_logp: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
    """Ablation without policy shaping (paper Table 4, "w/o policy shaping"): -A w. Returns [N, T]."""
    return -torch.exp(_log_ratio(logp, behaviour_logp)) * adv[:, None]


def _current_behaviour_term(logp: torch.Tensor, behaviour_logp: torch.Tensor, adv: torch.Tensor, *,
                            term: TokenTerm) -> torch.Tensor:
    return term(logp, logp.detach(), adv)


REPLAY_OLD_LOGPROBS = ("recorded", "current")
"""Where a replayed row's behaviour log-probs come from: as stored at collection, or the current policy's."""


def replay_behaviour(term: TokenTerm, source: str) -> TokenTerm:
    """Paper Table 6 "w/o IS correction": source "current" makes pi_behaviour = pi_theta (detached), so w = 1.

    "recorded" returns `term` unchanged (the stored trainer log-probs, paper/code). "current" returns a
    term that ignores the stored log-probs and uses logp.detach() instead: the weight is exactly 1 on
    every replayed token, f(1) = 1 / (1 + beta) with shaping, and the gradient weight on log pi is
    beta / (1 + beta)^2 (0.0826 for beta = 0.1; 1 without shaping). The loss's iw statistics still
    report the recorded ratio (how far the policy moved since collection); shaped_iw_mean the weight used.
    """
    if source not in REPLAY_OLD_LOGPROBS:
        raise LossInputError(f"unknown replay_old_logprobs {source!r}; choose from {list(REPLAY_OLD_LOGPROBS)}")
    return term if source == "recorded" else partial(_current_behaviour_term, term=term)


def entropy_bonus_term(entropy_tok: torch.Tensor) -> torch.Tensor:
    """Entropy bonus as a loss (code, coefficient 0.001): -H_t per token. [N, T] -> [N, T]."""
    return -entropy_tok


def kl_k3_term(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(pi_theta || pi_ref) per token: exp(d) - d - 1, d = ref_logp - logp. [N, T]."""
    d = (ref_logp - logp).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)  # [N, T]
    return torch.exp(d) - d - 1.0


def aggregate(tok_loss: torch.Tensor, mask: torch.Tensor, denominator: float | torch.Tensor) -> torch.Tensor:
    """Masked sum / denominator: sum_{n,t} loss[n, t] mask[n, t] / denominator.

    Masked positions contribute exactly 0 value and 0 gradient, even if `tok_loss` is inf/NaN there.

    Args:
        tok_loss: [N, T]; mask: [N, T] bool or float weights; denominator: from
            `token_mean_denominator` or `seq_sum_norm_denominator`, built once per mini-batch.
    """
    if tok_loss.shape != mask.shape:
        raise LossInputError(f"tok_loss {tuple(tok_loss.shape)} and mask {tuple(mask.shape)} differ")
    if float(denominator) <= 0:
        raise LossInputError(f"loss denominator must be > 0, got {float(denominator)}")
    kept = torch.where(mask != 0, tok_loss, torch.zeros_like(tok_loss))  # [N, T]
    if mask.dtype != torch.bool:
        kept = kept * mask
    return kept.sum() / denominator


def token_mean_denominator(mask: torch.Tensor) -> float:
    """Token mean (paper Eq. 4): the number of response tokens in the whole mini-batch (at least 1)."""
    return max(float((mask != 0).sum().item()), 1.0)


def seq_sum_norm_denominator(n_sequences: int, max_response_len: int) -> float:
    """Dr.GRPO / authors' code: per-sequence token sum / max response length, mean over sequences.

    Returns n_sequences * max_response_len for the whole mini-batch.
    """
    if n_sequences < 1 or max_response_len < 1:
        raise LossInputError(
            f"n_sequences and max_response_len must be >= 1, got {n_sequences} and {max_response_len}")
    return float(n_sequences * max_response_len)


def micro_sum_norm_denominators(micro_mask: torch.Tensor, max_response_len: int, ranks: int) -> tuple[float, float]:
    """Authors' code aggregation: per micro-batch sum(pg) / max_len - entropy_coef * token-mean H.

    Micro-batch losses are summed and gradients averaged over `ranks` processes, so this returns the
    denominators of one micro-batch: (policy-gradient: max_len * ranks, entropy / KL: the
    micro-batch's response tokens * ranks). Example: 3 response tokens, max_len 4, 1 rank -> (4.0, 3.0).
    """
    if max_response_len < 1 or ranks < 1:
        raise LossInputError(f"max_response_len and ranks must be >= 1, got {max_response_len} and {ranks}")
    return float(max_response_len * ranks), float(ranks) * max(float((micro_mask != 0).sum().item()), 1.0)


def virtual_micro_batches(total_tokens: int, micro_tokens: int) -> int:
    """Authors' code: verl's dynamic micro-batch count on one rank, k = ceil(total / micro_tokens) (at least 1);
    verl then takes the maximum over ranks (seqlen_balancing), which the caller does."""
    if micro_tokens < 1:
        raise LossInputError(f"micro_tokens must be >= 1, got {micro_tokens}")
    return max(1, math.ceil(total_tokens / micro_tokens))


def virtual_micro_denominator(response_tokens: int, total_tokens: int, micro_tokens: int, ranks: int,
                              micro_batches: int | None = None) -> float:
    """Authors' code (micro_sum_norm): the entropy and KL token means are per verl dynamic micro-batch of at
    most `micro_tokens` tokens (prompt + response), summed, ranks averaged: k micro-batches of equal shares
    (k = `micro_batches`, the maximum over ranks, else this rank's `virtual_micro_batches`), so each token
    counts 1 / (ranks * response_tokens / k), whatever the memory micro-batches. Example: 3,000 response
    tokens of 40,000, 32,768-token batches, 1 rank -> 1500.0."""
    if micro_tokens < 1 or ranks < 1:
        raise LossInputError(f"micro_tokens and ranks must be >= 1, got {micro_tokens} and {ranks}")
    k = virtual_micro_batches(total_tokens, micro_tokens) if micro_batches is None else max(1, int(micro_batches))
    return float(ranks) * max(float(response_tokens), 1.0) / k


def _masked_mean(x: torch.Tensor, sel: torch.Tensor) -> float:
    return float(x[sel].float().mean().item()) if bool(sel.any()) else 0.0


def _check_shapes(logp, old_logp, adv, mask, is_replay, entropy_tok, ref_logp) -> None:
    n_t = tuple(logp.shape)
    if logp.dim() != 2:
        raise LossInputError(f"logp must be [N, T], got {n_t}")
    for name, t in (("old_logp", old_logp), ("mask", mask), ("entropy_tok", entropy_tok),
                    ("ref_logp", ref_logp)):
        if t is not None and tuple(t.shape) != n_t:
            raise LossInputError(f"{name} must have logp's shape {n_t}, got {tuple(t.shape)}")
    for name, t in (("adv", adv), ("is_replay", is_replay)):
        if tuple(t.shape) != n_t[:1]:
            raise LossInputError(f"{name} must be [N] = {n_t[:1]}, got {tuple(t.shape)}")


def mixed_policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
                      is_replay: torch.Tensor, *, onpolicy_term: TokenTerm, replay_term: TokenTerm,
                      denominator: float | torch.Tensor, entropy_tok: torch.Tensor | None = None,
                      entropy_coef: float = 0.0, ref_logp: torch.Tensor | None = None,
                      kl_coef: float = 0.0, onpolicy_weight: torch.Tensor | None = None,
                      mean_denominator: float | None = None,
                      tensor_stats: bool = False) -> tuple[torch.Tensor, dict[str, float]]:
    """ExGRPO Eq. 4 (code weighting): L = L_on + L_replay - entropy_coef H + kl_coef KL.

    Each part is `aggregate`d with the same mini-batch denominator, so micro-batch losses add up.
    The stats report H and KL themselves (positive), "loss/shaped_iw_mean" is the weight the replay
    term applies (f(w) with shaping, w without), and "loss/clipfrac" the fraction of on-policy tokens
    whose term differs from the unclipped surrogate -r A. Without entropy_tok / ref_logp, their
    stats are 0.

    Args:
        logp: [N, T] current log-probs (with grad); old_logp: [N, T] pi_old for on-policy rows, the
            stored behaviour log-probs for replayed rows.
        adv: [N]; mask: [N, T] response mask; is_replay: [N] bool.
        onpolicy_term / replay_term: (logp, old_logp, adv) -> [N, T], e.g.
            `functools.partial(clipped_ratio_term, clip_eps=0.2)`, `partial(shaped_replay_term, beta=0.1)`.
        denominator: built once per mini-batch (`token_mean_denominator` / `seq_sum_norm_denominator`).
        entropy_tok: [N, T] entropies (needed when entropy_coef > 0); ref_logp: [N, T] (kl_coef > 0).
        onpolicy_weight: [N, T] detached per-token factor on the on-policy term (TIS weights).
        mean_denominator: the entropy and KL terms' own denominator (`micro_sum_norm_denominators`,
            the authors' token mean per micro-batch); None: `denominator`.
        tensor_stats: stats as 0-d tensors on logp's device, computed without reading any value back to
            the host (the caller reduces them once per optimiser step); floats otherwise.

    Returns:
        scalar loss and detached stats ("loss/...").
    """
    _check_shapes(logp, old_logp, adv, mask, is_replay, entropy_tok, ref_logp)
    if entropy_coef != 0 and entropy_tok is None:
        raise LossInputError(f"entropy_coef = {entropy_coef} needs entropy_tok")
    if kl_coef != 0 and ref_logp is None:
        raise LossInputError(f"kl_coef = {kl_coef} needs ref_logp from a reference model")
    replay_rows = is_replay.bool()[:, None]  # [N, 1]
    on_mask = torch.where(replay_rows, torch.zeros_like(mask), mask)  # [N, T]
    rep_mask = torch.where(replay_rows, mask, torch.zeros_like(mask))  # [N, T]
    on_raw = onpolicy_term(logp, old_logp, adv)  # [N, T]
    if onpolicy_weight is not None and onpolicy_weight.shape != logp.shape:
        raise LossInputError(f"onpolicy_weight has shape {tuple(onpolicy_weight.shape)}, logp {tuple(logp.shape)}")
    on_tok = on_raw if onpolicy_weight is None else on_raw * onpolicy_weight.detach()
    rep_tok = replay_term(logp, old_logp, adv)  # [N, T]
    on_loss = aggregate(on_tok, on_mask, denominator)
    rep_loss = aggregate(rep_tok, rep_mask, denominator)
    total = on_loss + rep_loss
    ent_value = kl_value = torch.zeros((), device=logp.device)
    mean_denom = denominator if mean_denominator is None else mean_denominator
    if entropy_tok is not None:
        ent_value = aggregate(entropy_tok, mask, mean_denom)  # -entropy_bonus_term summed
        total = total + entropy_coef * aggregate(entropy_bonus_term(entropy_tok), mask, mean_denom)
    if ref_logp is not None:
        kl_value = aggregate(kl_k3_term(logp, ref_logp), mask, mean_denom)
        total = total + kl_coef * kl_value
    parts = {M.LOSS_TOTAL: total, M.LOSS_ONPOLICY: on_loss, M.LOSS_OFFPOLICY: rep_loss, M.LOSS_ENTROPY: ent_value,
             M.LOSS_KL: kl_value}
    if tensor_stats:
        stats = {k: v.detach().float() for k, v in parts.items()}
        stats.update(_ratio_stats_tensors(logp.detach(), old_logp, adv, on_raw.detach(), on_mask != 0,
                                          rep_mask != 0, replay_term))
        return total, stats
    stats = {k: float(v.detach()) for k, v in parts.items()}
    stats.update(_ratio_stats(logp.detach(), old_logp, adv, on_raw.detach(), on_mask != 0,
                              rep_mask != 0, replay_term))
    return total, stats


def _ratio_stats(logp, old_logp, adv, on_tok, on_sel, rep_sel, replay_term) -> dict[str, float]:
    """Clip fraction over on-policy tokens; importance-weight statistics over replayed tokens."""
    with torch.no_grad():
        clipped = on_tok > unclipped_ratio_term(logp, old_logp, adv)  # [N, T]
        w = torch.exp(_log_ratio(logp, old_logp))  # [N, T]
        shaped = -replay_term(logp, old_logp, torch.ones_like(adv))  # [N, T] weight the term applies
        w_rep = w[rep_sel].double()
        n_rep = w_rep.numel()
        return {
            M.CLIPFRAC: _masked_mean(clipped, on_sel),
            M.IW_MEAN: float(w_rep.mean()) if n_rep else 0.0,
            M.IW_MAX: float(w_rep.max()) if n_rep else 0.0,
            M.IW_VAR: float(w_rep.var(unbiased=False)) if n_rep else 0.0,
            M.SHAPED_IW_MEAN: _masked_mean(shaped, rep_sel),
            M.REPLAY_TOKENS: float(n_rep),
            M.ONPOLICY_TOKENS: float(on_sel.sum()),
        }


def _ratio_stats_tensors(logp, old_logp, adv, on_tok, on_sel, rep_sel, replay_term) -> dict[str, torch.Tensor]:
    """`_ratio_stats` as 0-d tensors, with masked sums instead of boolean indexing (no host sync)."""
    with torch.no_grad():
        clipped = (on_tok > unclipped_ratio_term(logp, old_logp, adv)).float()  # [N, T]
        w = torch.exp(_log_ratio(logp, old_logp)).double()  # [N, T]
        shaped = -replay_term(logp, old_logp, torch.ones_like(adv)).float()  # [N, T]
        n_on, n_rep = on_sel.sum().float(), rep_sel.sum().double()
        zero = torch.zeros_like(w)
        w_mean = torch.where(rep_sel, w, zero).sum() / n_rep.clamp(min=1)
        w_var = torch.where(rep_sel, (w - w_mean) ** 2, zero).sum() / n_rep.clamp(min=1)
        return {
            M.CLIPFRAC: torch.where(on_sel, clipped, 0.0).sum() / n_on.clamp(min=1),
            M.IW_MEAN: w_mean.float(),
            M.IW_MAX: torch.where(rep_sel, w, zero).amax().float() if w.numel() else n_rep.float() * 0,
            M.IW_VAR: w_var.float(),
            M.SHAPED_IW_MEAN: torch.where(rep_sel, shaped, 0.0).sum() / n_rep.float().clamp(min=1),
            M.REPLAY_TOKENS: n_rep.float(),
            M.ONPOLICY_TOKENS: n_on,
        }
