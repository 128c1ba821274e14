"""Group-relative advantages: hand-worked, naive loop reference, properties.

Run: .venv/bin/python -m pytest tests/exgrpo_core/test_advantages.py -q
"""

import math

import pytest
import torch

from exgrpo_core.algorithm.advantages import AdvantageInputError, compute_group_advantages


def test_hand_worked_group_mean_and_std():
    # group 0: rewards [1, 0, 0, 0], mean .25 -> A = [.75, -.25, -.25, -.25]
    # unbiased std = sqrt((.75^2 + 3 * .25^2) / 3) = sqrt(.75 / 3) = .5 -> A/std = [1.5, -.5, -.5, -.5]
    # group 1: all correct -> 0; group 2: all wrong -> 0
    rewards = torch.tensor([[1.0, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    adv, stats = compute_group_advantages(rewards, std_normalize=False)
    torch.testing.assert_close(adv[0], torch.tensor([0.75, -0.25, -0.25, -0.25]))
    assert torch.equal(adv[1:], torch.zeros(2, 4))
    assert stats == {"rollout/solve_all": pytest.approx(1 / 3), "rollout/solve_none": pytest.approx(1 / 3)}
    adv_n, _ = compute_group_advantages(rewards, std_normalize=True, eps=0.0)
    torch.testing.assert_close(adv_n[0], torch.tensor([1.5, -0.5, -0.5, -0.5]))


def test_mixed_group_is_a_plain_group_of_k():
    # K-1 = 3 fresh rewards [0, 1, 0] plus the replayed correct trajectory (reward 1) in the last slot:
    # mean = .5 -> A = [-.5, .5, -.5, .5]; the replayed row gets the positive advantage.
    fresh = torch.tensor([0.0, 1.0, 0.0])
    mixed = torch.cat([fresh, torch.ones(1)])[None]
    adv, _ = compute_group_advantages(mixed, std_normalize=False)
    torch.testing.assert_close(adv, torch.tensor([[-0.5, 0.5, -0.5, 0.5]]))


def _naive_advantages(rewards, std_normalize, eps):
    out = []
    for row in rewards.tolist():
        mean = sum(row) / len(row)
        std = math.sqrt(sum((x - mean) ** 2 for x in row) / (len(row) - 1))
        if all(x == row[0] for x in row):
            out.append([0.0] * len(row))
        elif std_normalize:
            out.append([(x - mean) / (std + eps) for x in row])
        else:
            out.append([x - mean for x in row])
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("std_normalize", [False, True])
def test_matches_naive_loop_on_random_rewards(std_normalize):
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randint(0, 2, (64, 8), generator=gen).double()
    rewards[:5] = 1.0  # make sure all-equal groups are present
    rewards[5:9] = torch.rand(4, 8, generator=gen, dtype=torch.float64)  # non-binary rewards too
    adv, _ = compute_group_advantages(rewards, std_normalize=std_normalize, eps=1e-6)
    torch.testing.assert_close(adv, _naive_advantages(rewards, std_normalize, 1e-6))


def test_properties_zero_sum_and_no_signal_from_equal_groups():
    gen = torch.Generator().manual_seed(1)
    rewards = torch.randint(0, 2, (200, 8), generator=gen).float()
    adv, stats = compute_group_advantages(rewards, std_normalize=False)
    torch.testing.assert_close(adv.sum(dim=1), torch.zeros(200), atol=1e-6, rtol=0)
    equal = (rewards == rewards[:, :1]).all(dim=1)
    assert torch.equal(adv[equal], torch.zeros_like(adv[equal]))  # exactly 0, not round-off
    assert (adv[~equal] != 0).all()
    assert stats["rollout/solve_all"] == pytest.approx((rewards == 1).all(1).float().mean().item())
    assert stats["rollout/solve_none"] == pytest.approx((rewards == 0).all(1).float().mean().item())


def test_equal_non_binary_rewards_get_exact_zero():
    # 0.1 * 7 / 7 is not exactly 0.1 in floating point; the all-equal rule must still give 0.
    adv, _ = compute_group_advantages(torch.full((1, 7), 0.1), std_normalize=True)
    assert torch.equal(adv, torch.zeros(1, 7))


def test_integer_rewards_are_accepted():
    adv, _ = compute_group_advantages(torch.tensor([[1, 0]]), std_normalize=False)
    assert adv.dtype == torch.float32 and adv.tolist() == [[0.5, -0.5]]


@pytest.mark.parametrize("bad, match", [
    (torch.ones(8), "must be \\[G, K\\]"),
    (torch.ones(3, 1), "K >= 2"),
    (torch.tensor([[1.0, float("nan")]]), "NaN"),
])
def test_bad_input_is_rejected(bad, match):
    with pytest.raises(AdvantageInputError, match=match):
        compute_group_advantages(bad, std_normalize=False)
