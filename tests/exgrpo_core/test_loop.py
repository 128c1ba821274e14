"""Iteration stages on a tiny session: batch mix, mixed groups, lowest-entropy replay, delayed start."""

from __future__ import annotations

import pytest
import torch

from exgrpo_core import loop
from exgrpo_core.config.load import load_config
from exgrpo_core.run.session import open_session
from exgrpo_core.types import Question


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


def _groups(n_fresh: int, n_replay: int, K: int = 4):
    """Fresh-then-replay groups, as `update_buffer` returns them, and their replayed trajectories."""
    def roll(uid, i, replayed_from=None):
        return loop.Rollout(uid, [1], [2, 3], [0.0, 0.0], "", False, 0, reward=float(i % 2),
                            replayed_from=replayed_from)
    groups = [loop.GroupResult(f"f{q}", [roll(f"f{q}", i) for i in range(K)]) for q in range(n_fresh)]
    groups += [loop.GroupResult(f"r{q}", [roll(f"r{q}", i) for i in range(K - 1)], is_replay=True, replayed=1)
               for q in range(n_replay)]
    replayed = {f"r{q}": roll(f"r{q}", 1, replayed_from=q) for q in range(n_replay)}
    return groups, replayed


def test_fresh_and_mixed_groups_share_mini_batches_in_a_seeded_order():
    """(code) the collated batch is shuffled: at rho = 0.5 and 2 mini-batches, mixed groups land in both."""
    import random

    from exgrpo_core.training.batch import minibatch_rows

    groups, replayed = _groups(4, 4)
    both = 0
    for seed in range(20):
        rows, advs, qidx, _ = loop.shuffled_rows(groups, replayed, False, random.Random(seed))
        assert len(rows) == len(advs) == len(qidx) == 32
        halves = minibatch_rows(qidx, 2)
        mixed = [any(rows[i].question_uid.startswith("r") for i in half) for half in halves]
        both += all(mixed)
        again = loop.shuffled_rows(groups, replayed, False, random.Random(seed))
        assert [r.question_uid for r in again[0]] == [r.question_uid for r in rows] and again[2] == qidx
        for q in set(qidx):  # a group's rows stay together, the replayed trajectory last
            members = [rows[i] for i in range(len(rows)) if qidx[i] == q]
            assert len({r.question_uid for r in members}) == 1
    assert both >= 15  # all four mixed groups in one half: 2/70 of the orders


def test_the_step_that_switches_replay_on_is_still_clipped(session, monkeypatch):
    """(code) replay switches on after the step's update: that step trains with the warm-up's clip."""
    terms = []
    optimise = session.team.optimise
    monkeypatch.setattr(session.team, "optimise", lambda batch, **kw: (terms.append(kw["onpolicy_term"]),
                                                                      optimise(batch, **kw))[1])
    assert not session.replay_active
    first = loop.run_iteration(session)  # start_threshold 0: verify switches replay on at step 0
    second = loop.run_iteration(session)
    assert first["buffer/replay_active"] == 1 and second["buffer/replay_active"] == 1
    assert getattr(terms[0], "func", None) is loop.losses.clipped_ratio_term
    assert terms[1] is loop.losses.unclipped_ratio_term
    assert loop.clips_onpolicy("always", True) and not loop.clips_onpolicy("never", False)


@pytest.mark.parametrize("rule", ["grade", "zero"])
def test_truncated_responses_are_graded_or_zeroed_and_the_rewarded_ones_counted(rule):
    from types import SimpleNamespace

    cfg = load_config("tiny", ["buffer.replay_ratio=0", f"reward.truncated={rule}"])
    rows = [loop.Rollout("q", [1], [2], [0.0], "12", cut, 0) for cut in (True, True, False)]
    s = SimpleNamespace(cfg=cfg, replay_active=False, step=0, questions={"q": Question("q", (), "12")},
                        verify=lambda texts, answers: [(1.0, "correct"), (0.0, "wrong"), (1.0, "correct")])
    stats = loop.verify(s, rows)
    assert stats["verify/truncated_rewarded"] == 1  # the first: cut at the length limit, yet rewarded
    assert [r.reward for r in rows] == ([1.0, 0.0, 1.0] if rule == "grade" else [0.0, 0.0, 1.0])
    assert rows[0].reason == ("correct" if rule == "grade" else "truncated")
    assert stats["rollout/reward_mean"] == pytest.approx(2 / 3 if rule == "grade" else 1 / 3)


def test_bf16_compute_keeps_float32_master_weights():
    """A 1e-6 AdamW step (the GPU presets' lr) is lost on bf16 weights and kept on float32 masters,
    which is why a bf16 GPU run trains float32 weights (the GPU side: training/test_cuda.py)."""
    from types import SimpleNamespace

    from exgrpo_core.run.session import adamw, master_dtype

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
