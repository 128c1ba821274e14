"""Staleness of replayed trajectories: age and importance-weight distributions per step."""

from __future__ import annotations

import math

import pytest
import sqlalchemy as sa
import torch

from exgrpo_core import loop, metrics as M
from exgrpo_core.config.load import load_config
from exgrpo_core.observe import staleness
from exgrpo_core.run.session import open_session


def test_replay_stats_by_hand():
    ln2, ln4 = math.log(2), math.log(4)
    out = staleness.replay_stats(10, [7, 9], [[0.0, ln2 - 1.0], [ln4 - 2.0]], [[0.0, -1.0], [-2.0]], 0.1)
    assert out[M.REPLAY_AGE_MEAN] == 2.0 and out[M.REPLAY_AGE_MAX] == 3.0  # ages 3 and 1
    # token weights w = 1, 2, 4: linear-interpolated quantiles
    assert out[M.REPLAY_W_P10] == pytest.approx(1.2) and out[M.REPLAY_W_P50] == pytest.approx(2.0)
    assert out[M.REPLAY_W_P90] == pytest.approx(3.6) and out[M.REPLAY_W_MAX] == pytest.approx(4.0)
    assert out[M.REPLAY_FW_P50] == pytest.approx(2 / 2.1)  # f(w) = w / (w + beta)
    f = sorted(w / (w + 0.1) for w in (1, 2, 4))
    assert out[M.REPLAY_FW_P10] == pytest.approx(f[0] + 0.2 * (f[1] - f[0]))
    plain = staleness.replay_stats(10, [7, 9], [[0.0, ln2 - 1.0], [ln4 - 2.0]], [[0.0, -1.0], [-2.0]], None)
    assert plain[M.REPLAY_FW_P90] == pytest.approx(plain[M.REPLAY_W_P90])  # no shaping: f(w) = w


def test_nothing_replayed_gives_zeros_for_every_key():
    out = staleness.replay_stats(3, [], [], [], 0.1)
    assert set(out) == set(staleness.KEYS) and not any(out.values())
    assert set(staleness.KEYS) <= set(M.STEP_METRICS)


def half_right(texts, answers):
    return [(1.0, "correct") if i % 2 == 0 else (0.0, "wrong") for i in range(len(texts))]


@pytest.mark.parametrize("shaping", [True, False])
def test_a_tiny_run_logs_ages_and_weights_that_match_the_database_and_the_loss(tmp_path, shaping):
    db = tmp_path / "x.db"
    cfg = load_config("tiny", [f"run.output_dir={tmp_path}", f"run.db_url=sqlite:///{db}", "run.resume=never",
                               "rollout.max_response_tokens=3", "rollout.group_size=4", "train.batch_size=8",
                               "train.mini_batch_size=8", "buffer.start_threshold=0",
                               f"loss.policy_shaping={str(shaping).lower()}"])
    torch.manual_seed(0)
    s = open_session(cfg, verify=half_right)
    try:
        steps = [loop.run_iteration(s) for _ in range(5)]
        run_id = s.run_id
    finally:
        s.close()
    eng = sa.create_engine(f"sqlite:///{db}")
    with eng.connect() as c:
        ages = c.execute(sa.text("select r.step, avg(r.step - t.step), max(r.step - t.step) from replays r "
                                 "join trajectories t on t.id = r.trajectory_id where r.run_id = :r group by r.step"),
                         {"r": run_id}).all()
    eng.dispose()
    assert len(ages) >= 3, "the tiny run should replay from its second step on"
    for step, mean_age, max_age in ages:
        m = steps[step]
        assert m[M.REPLAY_AGE_MEAN] == pytest.approx(mean_age) and m[M.REPLAY_AGE_MAX] == max_age >= 1
        # one optimiser step per iteration: the loss saw the same policy the selection pass scored with
        assert m[M.REPLAY_W_MAX] == pytest.approx(m[M.IW_MAX], rel=1e-4)
        assert m[M.REPLAY_W_P10] <= m[M.REPLAY_W_P50] <= m[M.REPLAY_W_P90] <= m[M.REPLAY_W_MAX]
        assert m[M.UNFILLED_SLOTS] == cfg.replay_questions - m[M.REPLAYED_SAMPLES]
        if shaping:
            assert 0 < m[M.REPLAY_FW_P10] <= m[M.REPLAY_FW_P50] <= m[M.REPLAY_FW_P90] < 1
        else:
            assert m[M.REPLAY_FW_P50] == pytest.approx(m[M.REPLAY_W_P50])
    assert not any(steps[0][k] for k in staleness.KEYS)  # step 0 replays nothing
