"""Iteration stages on a tiny session: batch mix, mixed groups, lowest-entropy replay, delayed start."""

from __future__ import annotations

import pytest
import torch

from exgrpo_core import loop
from exgrpo_core.config_io import load_config
from exgrpo_core.session import open_session


def half_right(texts, answers):
    """Toy reward alternating 1, 0, 1, ... over each call: every group is mixed, none all-correct."""
    return [(1.0, "correct") if i % 2 == 0 else (0.0, "wrong") for i in range(len(texts))]


@pytest.fixture
def session(tmp_path):
    cfg = load_config("tiny", [f"run.output_dir={tmp_path}", f"run.db_url=sqlite:///{tmp_path / 'x.db'}",
                               "rollout.max_response_tokens=3", "rollout.group_size=4", "train.batch_size=8",
                               "train.mini_batch_size=4", "buffer.start_threshold=0", "run.resume=never"])
    torch.manual_seed(0)
    s = open_session(cfg, verify=half_right)
    yield s
    s.close()


def test_batch_mixes_rho_b_experiential_and_the_rest_fresh(session):
    for _ in range(3):
        loop.run_iteration(session)
    plan = loop.plan_batch(session)
    assert len(plan.replay) == 4 and len(plan.fresh) == 4  # rho = 0.5 of B = 8
    assert not set(plan.replay) & set(plan.fresh)
    state = session.store.buffer_state(session.run_id, 4)
    pooled = {u for uids in state.buckets.values() for u in uids}
    assert set(plan.replay) <= pooled


def test_mixed_group_is_k_minus_one_fresh_plus_the_lowest_entropy_trajectory(session):
    for _ in range(3):
        loop.run_iteration(session)
    plan = loop.plan_batch(session)
    rollouts, _ = loop.generate(session, plan)
    for uid in plan.replay:
        assert sum(r.question_uid == uid for r in rollouts) == 3  # K - 1 fresh
    loop.verify(session, rollouts)
    loop.update_buffer(session, plan, rollouts)
    chosen, stats = loop.select_trajectories(session, plan)
    assert stats["select/replayed_samples"] == len(chosen) > 0
    cands = session.store.candidates(session.run_id, list(chosen), before_step=plan.step)
    for uid, r in chosen.items():
        options = cands[uid]
        by_id = {e.id: e for e in options}
        assert r.replayed_from in by_id and r.reward == 1.0
        assert r.behaviour_logprobs == pytest.approx(by_id[r.replayed_from].behaviour_logprobs)
        rescored = [loop.Rollout(uid, session.prompt_ids(uid), e.response_ids, [0.0] * len(e.response_ids),
                                 e.text, False, e.step)
                    for e in options]
        loop.score_rollouts(session, rescored)
        assert r.entropy == pytest.approx(min(x.entropy for x in rescored), abs=1e-5)


def test_replay_waits_for_the_correct_fraction_to_pass_the_threshold(tmp_path):
    cfg = load_config("tiny", [f"run.output_dir={tmp_path}", f"run.db_url=sqlite:///{tmp_path / 'y.db'}",
                               "buffer.start_threshold=0.99", "rollout.group_size=4", "run.resume=never"])
    s = open_session(cfg, verify=half_right)
    try:
        stats = [loop.run_iteration(s) for _ in range(2)]
    finally:
        s.close()
    assert all(m["buffer/replay_active"] == 0 and m["select/replayed_samples"] == 0 for m in stats)
    assert all(m["buffer/collected"] == 0 for m in stats)  # (code) no collection before replay starts


def test_bf16_compute_keeps_float32_master_weights():
    """A 1e-6 AdamW step (the GPU presets' lr) is lost on bf16 weights and kept on float32 masters,
    which is why a bf16 GPU run trains float32 weights (the GPU side: training/test_cuda.py)."""
    from types import SimpleNamespace

    from exgrpo_core.session import adamw, master_dtype

    cfg = load_config("tiny", ["model.dtype=bfloat16"])
    assert master_dtype(cfg, SimpleNamespace(mixed_precision="bf16")) == "float32"
    assert master_dtype(cfg, SimpleNamespace(mixed_precision="no")) == "bfloat16"  # CPU: as configured
    moved = {}
    for dtype in (torch.bfloat16, torch.float32):
        w = torch.nn.Parameter(torch.full((64,), 0.05, dtype=dtype))
        start = w.detach().clone()
        opt = adamw([w], lr=1e-6, weight_decay=0.0)
        w.grad = torch.ones_like(w)
        opt.step()
        moved[dtype] = not torch.equal(w.detach(), start)
    assert moved == {torch.bfloat16: False, torch.float32: True}
