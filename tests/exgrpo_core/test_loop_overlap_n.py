"""rollout.overlap = N > 1 (thread sampler): while step t trains, steps up to t+N are sampled, step t+N's from
the weights step t started with; each batch records that version; a batch older than the bound is dropped; a
resumed run, its batches in flight included, trains as the uninterrupted one."""

from __future__ import annotations

import pytest
import torch
from sqlalchemy import select
from test_loop_overlap import _cfg as _cfg_4_steps
from test_loop_overlap import _open as _open_4_steps
from test_loop_overlap import _weights

from exgrpo_core import loop
from exgrpo_core import metrics as M
from exgrpo_core.store.tables import Trajectory as T


def _cfg(tmp_path, *extra):
    return _cfg_4_steps(tmp_path, "run.steps=5", *extra)


def _open(tmp_path, *extra):
    return _open_4_steps(tmp_path, "run.steps=5", *extra)


def test_two_ahead_each_batch_is_sampled_by_the_weights_its_planning_step_started_with(tmp_path):
    s = _open(tmp_path, "rollout.overlap=2", "run.resume=never")
    try:
        start = _weights(s)
        outs = [loop.run_iteration(s)]
        assert [(j.plan.step, j.version) for j in s.ahead.jobs] == [(1, 0), (2, 0)]
        loop.overlap.wait(s)
        copy = s.ahead.sampler.engine.model.state_dict()
        assert all(torch.equal(copy[k], v) for k, v in start.items())  # both from step 0's starting weights
        step1 = _weights(s)
        outs.append(loop.run_iteration(s))
        assert [(j.plan.step, j.version) for j in s.ahead.jobs] == [(2, 0), (3, 1)]
        loop.overlap.wait(s)
        copy = s.ahead.sampler.engine.model.state_dict()
        assert all(torch.equal(copy[k], v) for k, v in step1.items())  # step 3's batch: step 1's starting weights
        outs += [loop.run_iteration(s) for _ in range(3)]
        assert s.ahead.jobs == []  # nothing planned past the run's last step
        assert [o[M.FRESH_STALENESS] for o in outs] == [0.0, 1.0, 2.0, 2.0, 2.0]
        assert all(o[M.FRESH_DROPPED] == 0.0 for o in outs)
        with s.store.engine.connect() as conn:
            steps = set(conn.execute(select(T.collected_step, T.step).where(T.run_id == s.run_id)).all())
        assert steps == {(0, 0), (1, 0), (2, 0), (3, 1), (4, 2)}  # (trained at, sampled by)
    finally:
        s.close()


def test_a_batch_past_the_bound_is_dropped_and_sampled_again(tmp_path):
    s = _open(tmp_path, "rollout.overlap=2", "rollout.max_staleness=1", "run.resume=never")
    try:
        outs = [loop.run_iteration(s) for _ in range(3)]
        assert [o[M.FRESH_DROPPED] for o in outs] == [0.0, 0.0, 1.0]  # step 2's batch, sampled by version 0
        assert [o[M.FRESH_STALENESS] for o in outs] == [0.0, 1.0, 0.0]
    finally:
        s.close()


def _run(tmp_path, kill_after: int | None):
    """Five steps two ahead, checkpointing each; with `kill_after`, the session is dropped after that step's
    checkpoint (its two batches in flight stored in it) and a new one resumes."""
    s = _open(tmp_path, "rollout.overlap=2")
    lengths = []
    while s.step < 5:
        lengths.append(loop.run_iteration(s)[M.RESPONSE_LENGTH])
        s.save()
        if kill_after is not None and s.step == kill_after + 1:
            s.close()
            s = _open(tmp_path, "rollout.overlap=2", "run.resume=must")
            assert s.resumed_from == kill_after
            assert [(j.plan.step, j.version) for j in s.ahead.jobs] == [(kill_after + 1, kill_after - 1),
                                                                        (kill_after + 2, kill_after)]
            kill_after = None
    w = _weights(s)
    s.close()
    return lengths, w


def test_a_resumed_run_two_ahead_reaches_the_uninterrupted_runs_weights(tmp_path):
    lengths_a, w_a = _run(tmp_path / "a", None)
    lengths_b, w_b = _run(tmp_path / "b", 2)
    assert lengths_a == pytest.approx(lengths_b)
    assert all(torch.equal(w_a[k], w_b[k]) for k in w_a)


def test_more_than_one_ahead_is_refused_where_the_sampler_holds_one_batch(tmp_path):
    with pytest.raises(Exception, match="overlap=2 with rollout.engine=remote: each push pauses the server"):
        _cfg(tmp_path, "rollout.overlap=2", "rollout.engine=remote", "rollout.server_url=http://127.0.0.1:1")
    with pytest.raises(Exception, match="overlap=2 with rollout.overlap_sampler=process: the sampler process"):
        _cfg(tmp_path, "rollout.overlap=2", "rollout.overlap_sampler=process")
    with pytest.raises(Exception, match="rollout.overlap"):
        _cfg(tmp_path, "rollout.overlap=9")
