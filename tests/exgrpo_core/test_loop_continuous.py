"""Continuous rewards through the whole iteration (tiny session, a real reward function in the verifier
processes): buckets by reward spread, experience = above the group's mean, the replayed trajectory
keeps its stored reward; with 0/1 rewards the reward-function path trains exactly as math-verify's."""

from __future__ import annotations

import textwrap

import pytest
import torch
from sqlalchemy import select

from exgrpo_core import loop
from exgrpo_core.algorithm import spread
from exgrpo_core.config.load import load_config
from exgrpo_core.run.session import open_session
from exgrpo_core.store.tables import GroupResultRow, Trajectory

REWARDS = '''
import zlib

def by_text(row, response):
    return (zlib.crc32(response.encode()) % 101) / 100

def parity(row, response):
    return float(zlib.crc32(response.encode()) % 2)
'''


@pytest.fixture
def reward_module(tmp_path, monkeypatch):
    (tmp_path / "loop_rewards.py").write_text(textwrap.dedent(REWARDS))
    monkeypatch.syspath_prepend(str(tmp_path))


def _config(tmp_path, name, *extra):
    return load_config("tiny", [f"run.output_dir={tmp_path}", f"run.db_url=sqlite:///{tmp_path / name}.db",
                                f"run.name={name}", "rollout.max_response_tokens=6", "rollout.group_size=4",
                                "train.batch_size=8", "train.mini_batch_size=4", "buffer.start_threshold=0",
                                "data.max_questions=12", "run.resume=never", *extra])


def test_a_continuous_run_buckets_by_spread_and_replays_stored_rewards(tmp_path, reward_module, monkeypatch):
    cfg = _config(tmp_path, "cont", "reward.fn=loop_rewards:by_text")
    assert cfg.reward.continuous and cfg.collect_max_k == 4
    torch.manual_seed(0)
    s = open_session(cfg)
    mixed = []
    rows_of = loop.shuffled_rows
    monkeypatch.setattr(loop, "shuffled_rows", lambda groups, replayed, *a: (mixed.append(dict(replayed)),
                                                                             rows_of(groups, replayed, *a))[1])
    try:
        stats = [loop.run_iteration(s) for _ in range(3)]
        with s.store.engine.connect() as conn:
            T, G = Trajectory, GroupResultRow
            trajs = conn.execute(select(T.id, T.question_id, T.collected_step, T.reward, T.in_pool, T.retired,
                                        T.verifier, T.verify_reason, T.text).where(T.run_id == s.run_id)).all()
            buckets = {(st, q): k for st, q, k in conn.execute(select(G.step, G.question_id, G.k).where(
                G.run_id == s.run_id))}
    finally:
        s.close()
    assert {t.verifier for t in trajs} == {"reward_fn"} and any(0 < t.reward < 1 for t in trajs)
    for step in range(3):
        groups = {}
        for t in trajs:
            if t.collected_step == step:
                groups.setdefault(t.question_id, []).append(t)
        fresh = {q: g for q, g in groups.items() if len(g) == 4}  # mixed groups store their K-1 fresh rows
        expected = spread.spread_buckets([spread.reward_spread([t.reward for t in g]) for g in groups.values()],
                                         4, cfg.buffer.spread_eps)
        assert [buckets[(step, q)] for q in groups] == expected
        for q, g in fresh.items():
            mean = sum(t.reward for t in g) / 4
            pooled = [t.text for t in g if t.in_pool or t.retired]  # above the mean, one per distinct response
            assert (len(pooled) == len(set(pooled)) and set(pooled) == {t.text for t in g if t.reward > mean}) or \
                buckets[(step, q)] == 0  # bucket 0 (least spread) is not collected (collect_min_k=1)
    stored = {t.id: t.reward for t in trajs}
    replays = [r for step in mixed for r in step.values()]
    assert replays, "replay never ran"
    assert all(r.reward == stored[r.replayed_from] for r in replays)
    assert any(r.reward < 1 for r in replays)  # a continuous experience is replayed with its own reward
    assert stats[0]["rollout/reward_mean"] == pytest.approx(
        sum(t.reward for t in trajs if t.collected_step == 0) / 32)


def test_binary_rewards_train_the_same_through_a_reward_function_as_through_math_verify(tmp_path, reward_module):
    import zlib

    def parity(texts, answers):
        return [(float(zlib.crc32(t.encode()) % 2), "correct") for t in texts]

    runs = []
    for name, extra, verify in [("fn", ["reward.fn=loop_rewards:parity", "reward.kind=binary"], None),
                                ("mv", [], parity)]:
        torch.manual_seed(0)
        s = open_session(_config(tmp_path, name, *extra), verify=verify)
        try:
            stats = [loop.run_iteration(s) for _ in range(3)]
            with s.store.engine.connect() as conn:
                G, T = GroupResultRow, Trajectory
                history = conn.execute(select(G.step, G.question_id, G.k, G.is_replay).order_by(G.id)).all()
                pool = conn.execute(select(T.question_id, T.text, T.in_pool, T.retired).order_by(T.id)).all()
            runs.append((history, pool, [st["loss/total"] for st in stats], [st["select/replayed_samples"] for st in stats]))
        finally:
            s.close()
    assert runs[0] == runs[1]
    assert sum(runs[0][3]) > 0  # replay ran: the comparison covers mixed groups
