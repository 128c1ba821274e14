"""Staleness of the replayed trajectories: their age and importance weights, per step (docs/monitors.md).

Age = the replaying step minus the step whose policy sampled the trajectory. The importance weight
w_t = pi_theta(o_t) / pi_behaviour(o_t) of each replayed token is taken under the policy at the
step's start (the trajectory selection's scoring pass, before the step's first optimiser update),
and f(w) is the weight the replay term applies: w / (w + beta) with policy shaping, w without.
"""

from __future__ import annotations

import torch

from exgrpo_core import metrics as M
from exgrpo_core.algorithm import losses

KEYS = (M.REPLAY_AGE_MEAN, M.REPLAY_AGE_MAX, M.REPLAY_W_P10, M.REPLAY_W_P50, M.REPLAY_W_P90, M.REPLAY_W_MAX,
        M.REPLAY_FW_P10, M.REPLAY_FW_P50, M.REPLAY_FW_P90)


def replay_stats(step: int, sampled_steps: list[int], current_logp: list[list[float]],
                 behaviour_logp: list[list[float]], beta: float | None) -> dict[str, float]:
    """Age mean / max and w, f(w) quantiles (10th, 50th, 90th percentile; w also max) over the step's
    replayed tokens; f(w) = w / (w + beta) is policy shaping (ExGRPO Eq. 6), beta None the plain w.
    Every key 0 when nothing is replayed. Lists are per replayed trajectory."""
    if not sampled_steps:
        return dict.fromkeys(KEYS, 0.0)
    ages = [step - s for s in sampled_steps]
    cur = torch.tensor([x for c in current_logp for x in c] or [0.0], dtype=torch.float64)[None]  # [1, T]
    beh = torch.tensor([x for b in behaviour_logp for x in b] or [0.0], dtype=torch.float64)[None]
    one = torch.ones(1, dtype=torch.float64)
    w = -losses.plain_replay_term(cur, beh, one)[0]  # the loss's own w and f(w) (its log-ratio clamp included)
    f = w if beta is None else -losses.shaped_replay_term(cur, beh, one, beta)[0]
    q = torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)
    wq, fq = torch.quantile(w, q).tolist(), torch.quantile(f, q).tolist()
    return {M.REPLAY_AGE_MEAN: sum(ages) / len(ages), M.REPLAY_AGE_MAX: float(max(ages)),
            M.REPLAY_W_P10: wq[0], M.REPLAY_W_P50: wq[1], M.REPLAY_W_P90: wq[2], M.REPLAY_W_MAX: float(w.max()),
            M.REPLAY_FW_P10: fq[0], M.REPLAY_FW_P50: fq[1], M.REPLAY_FW_P90: fq[2]}
