"""Learning sanity: with a reward a tiny model can learn, GRPO and ExGRPO both raise the mean reward.

Toy verifiable reward: 1 when the response starts with a digit (about 10 of the tiny tokenizer's
~90 symbols, so ~1 in 9 at random init). A sign error in the on-policy term breaks the GRPO arm;
the replay-only arm switches the on-policy term off, so a sign error in policy shaping breaks it.
"""

from __future__ import annotations

import torch

from exgrpo_core import loop
from exgrpo_core.algorithm import losses
from exgrpo_core.config.load import load_config
from exgrpo_core.run.session import open_session


def starts_with_digit(texts, answers):
    return [(1.0, "correct") if t[:1].isdigit() else (0.0, "wrong") for t in texts]


def _train(tmp_path, overrides, steps):
    cfg = load_config("tiny", [
        f"run.output_dir={tmp_path}", f"run.db_url=sqlite:///{tmp_path / 'exp.db'}", "run.resume=never",
        "rollout.group_size=4", "rollout.max_response_tokens=2", "train.batch_size=8", "train.mini_batch_size=8",
        "train.lr=1e-2", "loss.entropy_coef=0", "train.skip_grad_norm=null", *overrides])
    torch.manual_seed(0)
    s = open_session(cfg, verify=starts_with_digit)
    try:
        history = [loop.run_iteration(s) for _ in range(steps)]
    finally:
        s.close()
    return history


def _gain(history, n=4):
    first = sum(h["rollout/reward_mean"] for h in history[:n]) / n
    last = sum(h["rollout/reward_mean"] for h in history[-n:]) / n
    return first, last


def test_onpolicy_grpo_raises_reward(tmp_path):
    history = _train(tmp_path, ["buffer.replay_ratio=0"], steps=16)
    first, last = _gain(history)
    assert last > first + 0.25, f"GRPO did not learn: reward {first:.2f} -> {last:.2f}"
    assert all(h["select/replayed_samples"] == 0 for h in history)


def test_exgrpo_raises_reward_and_replays(tmp_path):
    history = _train(tmp_path, ["buffer.replay_ratio=0.5", "buffer.start_threshold=0"], steps=16)
    first, last = _gain(history)
    assert last > first + 0.25, f"ExGRPO did not learn: reward {first:.2f} -> {last:.2f}"
    assert sum(h["select/replayed_samples"] for h in history) > 0


def test_replay_term_alone_raises_reward(tmp_path, monkeypatch):
    """Only replayed tokens carry gradient: the shaped off-policy term must push toward correct answers."""
    monkeypatch.setattr(losses, "unclipped_ratio_term", lambda logp, old_logp, adv: 0.0 * logp)
    history = _train(tmp_path, ["buffer.replay_ratio=0.75", "buffer.start_threshold=0",
                                "buffer.collect_before_replay=true", "train.lr=2e-2", "loss.clip_mode=never"],
                     steps=16)
    first, last = _gain(history)
    replayed = sum(h["select/replayed_samples"] for h in history)
    assert replayed > 10
    assert last > first + 0.15, f"replay-only learning failed: reward {first:.2f} -> {last:.2f}"


def test_sign_error_in_onpolicy_term_fails_to_learn(tmp_path, monkeypatch):
    original = losses.unclipped_ratio_term
    monkeypatch.setattr(losses, "unclipped_ratio_term", lambda logp, old_logp, adv: -original(logp, old_logp, adv))
    history = _train(tmp_path, ["buffer.replay_ratio=0", "loss.clip_mode=never"], steps=16)
    first, last = _gain(history)
    assert last <= first + 0.1, "a flipped on-policy loss still learned: the sanity test would not catch it"


def test_sign_error_in_replay_term_fails_to_learn(tmp_path, monkeypatch):
    original = losses.shaped_replay_term
    monkeypatch.setattr(losses, "unclipped_ratio_term", lambda logp, old_logp, adv: 0.0 * logp)
    monkeypatch.setattr(losses, "shaped_replay_term",
                        lambda logp, old_logp, adv, beta: -original(logp, old_logp, adv, beta))
    history = _train(tmp_path, ["buffer.replay_ratio=0.75", "buffer.start_threshold=0",
                                "buffer.collect_before_replay=true", "train.lr=2e-2", "loss.clip_mode=never"],
                     steps=16)
    first, last = _gain(history)
    assert last <= first + 0.1, "a flipped replay loss still learned: the sanity test would not catch it"
