"""Truncated and masked importance weights, per token and per sequence, and the sequence ratio."""

from __future__ import annotations

import math

import pytest
import torch

from exgrpo_core.algorithm import importance as I
from exgrpo_core.training.batch import tis_weights
from exgrpo_core.types import Rollout

TRAINER = torch.log(torch.tensor([0.5, 0.9, 0.2]))
SAMPLER = torch.log(torch.tensor([0.25, 0.9, 0.5]))  # token ratios 2, 1, 0.4; sequence ratio 0.8


@pytest.mark.parametrize("level, mode, cap, want", [
    ("token", "truncate", 1.5, [1.5, 1.0, 0.4]),
    ("token", "mask", 1.5, [0.0, 1.0, 0.4]),
    ("sequence", "truncate", 0.5, [0.5, 0.5, 0.5]),
    ("sequence", "truncate", 2.0, [0.8, 0.8, 0.8]),
    ("sequence", "mask", 0.5, [0.0, 0.0, 0.0]),
    ("sequence", "mask", 2.0, [0.8, 0.8, 0.8]),
])
def test_the_weight_of_each_token_follows_its_level_and_mode(level, mode, cap, want):
    torch.testing.assert_close(I.fresh_weights(TRAINER, SAMPLER, cap, level, mode), torch.tensor(want))


def test_the_sequence_ratio_is_the_product_and_stays_finite():
    assert math.isclose(I.sequence_ratio(TRAINER.tolist(), SAMPLER.tolist()), 0.8, rel_tol=1e-6)
    assert I.sequence_ratio([0.0] * 200, [-1.0] * 200) == math.exp(50)
    with pytest.raises(ValueError):
        I.fresh_weights(TRAINER, SAMPLER, 2.0, "segment")


def test_the_batch_carries_sequence_weights_on_fresh_rows_only():
    fresh = Rollout("q", [1, 2], [3, 4, 5], TRAINER.tolist(), "", False, 0, sampler_logprobs=SAMPLER.tolist())
    replayed = Rollout("q", [1, 2], [3, 4, 5], TRAINER.tolist(), "", False, 0, replayed_from=7,
                       sampler_logprobs=SAMPLER.tolist())
    old = torch.zeros(2, 5)
    old[:, 2:] = TRAINER
    w = tis_weights([fresh, replayed], old, 2.0, "sequence", "truncate")
    torch.testing.assert_close(w, torch.tensor([[1.0, 1.0, 0.8, 0.8, 0.8], [1.0] * 5]))
    torch.testing.assert_close(tis_weights([fresh, replayed], old, 1.5)[0, 2:], torch.tensor([1.5, 1.0, 0.4]))


def test_a_level_or_mode_without_a_cap_is_refused_in_one_line():
    from exgrpo_core.config.load import ConfigError, load_config

    with pytest.raises(ConfigError, match="need loss.tis_cap"):
        load_config("tiny", ["loss.is_mode=mask"])
    assert load_config("tiny", ["loss.tis_cap=2", "loss.is_level=sequence"]).loss.is_level == "sequence"
