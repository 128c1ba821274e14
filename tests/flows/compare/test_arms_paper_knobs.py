"""The arms of the paper's other tables resolve to exactly their knob (and nothing else changes)."""

from __future__ import annotations

import pytest

from exgrpo_core.config.load import flatten
from flows.compare.arms import ARMS, build_arm_runs


@pytest.mark.parametrize("arm, changed, ref", [
    ("mu_0.25", {"selection.mu": 0.25}, None),  # Table 3: Gaussian centred on Acc 0.25
    ("no_is_correction", {"loss.replay_old_logprobs": "current"}, 47.1),  # Table 6: w = 1 on replayed tokens
    ("review_retired", {"buffer.review_retired_every": 25, "buffer.review_fraction": 0.1}, None),  # Table 7
    ("prompt_replay", {"buffer.replay_mode": "prompt"}, None),  # the replay lab: K fresh, no stored trajectory
    ("max_age_8", {"buffer.max_age": 8}, None),  # the replay lab: no replay older than 8 steps
    ("age_decay", {"selection.age_half_life": 8.0}, None),  # the replay lab: draw weight halves every 8 steps
    ("dynamic_sampling", {"rollout.dynamic_sampling": True}, None),  # the replay lab: DAPO's filter and refill
    ("on_policy_ds", {"buffer.replay_ratio": 0.0, "rollout.dynamic_sampling": True}, None),
    ("seq_tis", {"loss.tis_cap": 2.0, "loss.is_level": "sequence"}, None),  # the replay lab: sequence TIS
    ("seq_mask", {"loss.tis_cap": 2.0, "loss.is_level": "sequence", "loss.is_mode": "mask"}, None),
])
def test_paper_knob_arm_differs_from_exgrpo_by_its_knob_only(arm, changed, ref):
    exgrpo, other = build_arm_runs("tiny", None, ["exgrpo", arm], [0], "cmp", evaluate=False)
    base, cfg = flatten(exgrpo.cfg), flatten(other.cfg)
    diff = {k: cfg[k] for k in cfg if cfg[k] != base.get(k) and k != "run.name"}
    # review_fraction's default already is 0.1: the arm states it, only the period differs from exgrpo
    assert diff == {k: v for k, v in changed.items() if base[k] != v}
    assert all(cfg[k] == v for k, v in changed.items())
    assert other.paper_id_avg == ref and ARMS[arm][1] == ref
    assert other.cfg.run.name == f"cmp-{arm}-s0"
