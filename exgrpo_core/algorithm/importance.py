"""Importance weights of fresh tokens when the sampler is not the trainer (vLLM): truncated (TIS) or masked (MIS)
importance sampling, per token or per sequence (`loss.tis_cap`, `loss.is_level`, `loss.is_mode`), and the
sequence ratios the replay lab logs for the sampler-trainer mismatch and for replay staleness.
Pure functions on log-prob tensors: numbers in, numbers out.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

LEVELS = ("token", "sequence")
MODES = ("truncate", "mask")
_MAX_LOG = 50.0  # a sequence's log-ratio is clamped here, so a long sequence's ratio stays finite


def fresh_weights(trainer_logp: torch.Tensor, sampler_logp: torch.Tensor, cap: float, level: str = "token",
                  mode: str = "truncate") -> torch.Tensor:
    """TIS / MIS weight of each response token of one fresh sequence, r = pi_trainer / pi_sampler (Yao et al. 2025):
    token level r_t, sequence level r = prod_t r_t (on every token); truncate: min(r, cap); mask: r where r <= cap,
    else 0 (the token, or the whole sequence, leaves the gradient)."""
    if level not in LEVELS or mode not in MODES:
        raise ValueError(f"importance level/mode must be in {LEVELS} / {MODES}, got {level!r} / {mode!r}")
    log_r = trainer_logp - sampler_logp
    if level == "sequence":
        log_r = log_r.sum().clamp(-_MAX_LOG, _MAX_LOG).expand_as(log_r)
    r = torch.exp(log_r)
    if mode == "truncate":
        return r.clamp(max=cap)
    return torch.where(r <= cap, r, torch.zeros_like(r))


def sequence_ratio(logp: Sequence[float], behaviour_logp: Sequence[float]) -> float:
    """Sequence importance ratio prod_t pi(o_t) / pi_behaviour(o_t) = exp(sum of log-ratios), log clamped at +-50."""
    if len(logp) != len(behaviour_logp):
        raise ValueError(f"{len(logp)} log-probs against {len(behaviour_logp)} behaviour log-probs")
    s = math.fsum(a - b for a, b in zip(logp, behaviour_logp))
    return math.exp(min(max(s, -_MAX_LOG), _MAX_LOG))
