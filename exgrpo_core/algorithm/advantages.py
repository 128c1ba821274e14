"""Group-relative advantages (ExGRPO §3.3), including the mixed group.

A mixed group (K-1 fresh rollouts plus the one replayed correct trajectory) is an ordinary group of K
rewards here: the caller puts the replayed trajectory's reward (1) in its row. Follows the paper and
the authors' code (Dr.GRPO): no std normalisation by default; `std_normalize=True` is the original GRPO.
"""

from __future__ import annotations

import torch

from exgrpo_core import metrics as M


class AdvantageInputError(ValueError):
    """Rewards that cannot form groups (wrong shape, group of one, non-finite values)."""


def compute_group_advantages(rewards: torch.Tensor, std_normalize: bool,
                             eps: float = 1e-6) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO group-relative advantage: A_i = r_i - mean(r_group) [/ (std(r_group) + eps)].

    Groups whose rewards are all equal get exactly 0 (no policy-gradient signal); they are counted as
    `rollout/solve_all` (every reward > 0) or `rollout/solve_none` (every reward <= 0). The std is the
    unbiased sample std over the K rewards (torch default, as in GRPO implementations).

    Example: rewards [[1, 0, 0, 1], [1, 1, 1, 1]] -> advantages [[.5, -.5, -.5, .5], [0, 0, 0, 0]],
    stats {"rollout/solve_all": 0.5, "rollout/solve_none": 0.0}.

    Args:
        rewards: [G, K] rewards of G groups of K responses (a mixed group is one row of K).
        std_normalize: divide by the group std (off in paper and code).
        eps: added to the std before dividing.

    Returns:
        advantages [G, K] float (same dtype as a float `rewards`, else float32), and stats.
    """
    if rewards.dim() != 2:
        raise AdvantageInputError(f"rewards must be [G, K], got shape {tuple(rewards.shape)}")
    if rewards.shape[1] < 2:
        raise AdvantageInputError(f"a group needs K >= 2 responses, got K = {rewards.shape[1]}")
    r = rewards if rewards.is_floating_point() else rewards.float()
    if not torch.isfinite(r).all():
        raise AdvantageInputError("rewards contain NaN or inf")
    adv = r - r.mean(dim=1, keepdim=True)  # [G, K]
    if std_normalize:
        adv = adv / (r.std(dim=1, keepdim=True) + eps)  # [G, K]
    all_equal = (r == r[:, :1]).all(dim=1, keepdim=True)  # [G, 1]
    adv = torch.where(all_equal, torch.zeros_like(adv), adv)  # exact 0, not float round-off
    g = max(r.shape[0], 1)
    stats = {
        M.SOLVE_ALL: float((r > 0).all(dim=1).sum().item()) / g,
        M.SOLVE_NONE: float((r <= 0).all(dim=1).sum().item()) / g,
    }
    return adv, stats
