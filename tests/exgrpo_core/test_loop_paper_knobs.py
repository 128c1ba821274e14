"""The loop hands selection.mu and loss.replay_old_logprobs to the rules (tiny session, real iterations)."""

from __future__ import annotations

import pytest
import torch
from sqlalchemy import text

from exgrpo_core import loop
from exgrpo_core.algorithm import selection
from exgrpo_core.config.load import load_config
from exgrpo_core.run.session import open_session


def half_right(texts, answers):
    return [(1.0, "correct") if i % 2 == 0 else (0.0, "wrong") for i in range(len(texts))]


@pytest.mark.parametrize("knobs, mu, weight", [([], 0.5, None),
                                               (["selection.mu=0.25", "loss.replay_old_logprobs=current"], 0.25,
                                                1 / 1.1)])
def test_the_iteration_uses_the_configured_centre_and_behaviour_logprobs(tmp_path, monkeypatch, knobs, mu, weight):
    cfg = load_config("tiny", [f"run.output_dir={tmp_path}", f"run.db_url=sqlite:///{tmp_path / 'x.db'}",
                               "rollout.max_response_tokens=3", "rollout.group_size=4", "train.batch_size=8",
                               "train.mini_batch_size=4", "buffer.start_threshold=0", "run.resume=never", *knobs])
    torch.manual_seed(0)
    s = open_session(cfg, verify=half_right)
    try:
        terms, weights = [], []
        optimise, sample = s.team.optimise, s.store.sample_replay_questions
        monkeypatch.setattr(s.team, "optimise", lambda batch, **kw: (terms.append(kw["replay_term"]),
                                                                     optimise(batch, **kw))[1])
        monkeypatch.setattr(s.store, "sample_replay_questions",
                            lambda run_id, K, n, w, rng, **kw: (weights.append(w), sample(run_id, K, n, w, rng, **kw))[1])
        for _ in range(2):
            loop.run_iteration(s)
        assert weights == [selection.bucket_weights(4, "gaussian", 1.0, "count", mu=mu)]  # replay from step 1
        logp = torch.log(torch.tensor([[0.3, 0.6]], dtype=torch.float64))
        stored = torch.log(torch.tensor([[0.1, 0.9]], dtype=torch.float64))
        applied = -terms[-1](logp, stored, torch.ones(1, dtype=torch.float64))
        w = torch.exp(logp - stored)
        expected = w / (w + 0.1) if weight is None else torch.full_like(w, weight)
        torch.testing.assert_close(applied, expected)
    finally:
        s.close()


def all_right(texts, answers):
    return [(1.0, "correct")] * len(texts)


@pytest.mark.parametrize("every", [0, 2])
def test_the_review_arm_puts_the_retired_set_back_on_its_period(tmp_path, every):
    cfg = load_config("tiny", [f"run.output_dir={tmp_path}", f"run.db_url=sqlite:///{tmp_path / 'x.db'}",
                               "rollout.max_response_tokens=2", "rollout.group_size=4", "train.batch_size=4",
                               "train.mini_batch_size=4", "buffer.start_threshold=0", "run.resume=never",
                               "buffer.replay_ratio=0", f"buffer.review_retired_every={every}",
                               "buffer.review_fraction=1.0"])
    torch.manual_seed(0)
    s = open_session(cfg, verify=all_right)  # every group all correct: each question retires when rolled out
    try:
        first = loop.run_iteration(s)
        retired_after_1 = set(s.store.retired_uids(s.run_id))
        second = loop.run_iteration(s)
        retired_after_2 = set(s.store.retired_uids(s.run_id))
    finally:
        s.close()
    assert first["buffer/newly_retired"] == 4 and len(retired_after_1) == 4 and first["buffer/reviewed_retired"] == 0
    if every:  # step 2: this step's 4 retire, then the review puts back all 8 (fraction 1)
        assert second["buffer/reviewed_retired"] == 8 and retired_after_2 == set()
    else:
        assert second["buffer/reviewed_retired"] == 0 and len(retired_after_2) == 8


def test_prompt_replay_draws_pooled_questions_with_k_fresh_rollouts_and_no_stored_trajectory(tmp_path, monkeypatch):
    cfg = load_config("tiny", [f"run.output_dir={tmp_path}", f"run.db_url=sqlite:///{tmp_path / 'x.db'}",
                               "rollout.max_response_tokens=3", "rollout.group_size=4", "train.batch_size=8",
                               "train.mini_batch_size=4", "buffer.start_threshold=0", "run.resume=never",
                               "buffer.replay_mode=prompt"])
    torch.manual_seed(0)
    s = open_session(cfg, verify=half_right)
    mixed = []
    rows_of = loop.shuffled_rows
    monkeypatch.setattr(loop, "shuffled_rows", lambda groups, replayed, *a: (mixed.append((groups, dict(replayed))),
                                                                             rows_of(groups, replayed, *a))[1])
    try:
        stats = [loop.run_iteration(s) for _ in range(3)]
        with s.store.engine.connect() as conn:
            replayed = conn.execute(text("select count(*) from replays")).scalar_one()
            times = conn.execute(text("select coalesce(sum(times_replayed), 0) from trajectories")).scalar_one()
    finally:
        s.close()
    experiential = [g for groups, _ in mixed for g in groups if g.is_replay]
    assert experiential, "no question was drawn from the pool"
    assert all(len(g.rollouts) == 4 and g.replayed == 0 for g in experiential)  # K fresh, nothing stored in the group
    assert all(not r for _, r in mixed) and replayed == 0 and times == 0
    assert [st["select/replayed_samples"] for st in stats] == [0.0] * 3
    assert sum(st["rollout/responses"] for st in stats) == 3 * 8 * 4  # every slot generated


def test_every_step_logs_its_replays_gap_to_the_target_and_the_questions_seen(tmp_path):
    assert loop.target_gap([], {1: 1.0}) == 0.0 and loop.target_gap([4, 4], {4: 2.0, 3: 2.0}) == 0.5
    assert loop.target_gap([3, 4], {4: 1.0, 3: 1.0}) == 0.0 and loop.target_gap([7], {3: 1.0}) == 1.0
    cfg = load_config("tiny", [f"run.output_dir={tmp_path}", f"run.db_url=sqlite:///{tmp_path / 'x.db'}",
                               "rollout.max_response_tokens=3", "rollout.group_size=4", "train.batch_size=8",
                               "train.mini_batch_size=4", "buffer.start_threshold=0", "run.resume=never"])
    torch.manual_seed(0)
    s = open_session(cfg, verify=half_right)
    try:
        stats = [loop.run_iteration(s) for _ in range(3)]
        with s.store.engine.connect() as conn:
            seen = conn.execute(text("select count(*) from question_states where n_groups > 0")).scalar_one()
            history = conn.execute(text("select step, question_id, k, is_replay from group_results order by id")).all()
    finally:
        s.close()
    assert stats[-1]["buffer/distinct_questions"] == seen and stats[0]["buffer/distinct_questions"] == 8
    weights = loop.replay_weights(cfg)
    last, drawn = {}, {}
    for step, qid, k, is_replay in history:
        if is_replay:
            drawn.setdefault(step, []).append(last.get(qid))
        last[qid] = k
    assert drawn, "nothing was replayed"
    assert [st["select/target_gap"] for st in stats] == [loop.target_gap(drawn.get(i, []), weights) for i in range(3)]
