"""rollout.overlap_timeout_s: a batch sampled ahead that does not arrive in time stops the sampler (the process
sampler's child killed) and ends the run in one error naming the step; the session still closes."""

from __future__ import annotations

import threading

import pytest

from exgrpo_core import loop
from exgrpo_core.rollout import overlap
from exgrpo_core.rollout.overlap import OverlapTimeout, Sampler
from exgrpo_core.run import locks
from exgrpo_core.types import BatchPlan
from tests.exgrpo_core.test_loop_overlap import _open
from tests.exgrpo_core.test_overlap_process import KW, _prompts

PLAN = BatchPlan(step=7, fresh=[], replay=[])


def _hang(sampler: Sampler, release: threading.Event) -> None:
    """The sampler's own engine copy blocks until `release` (a sampler that hangs)."""
    generate = sampler.engine.generate

    def blocked(*a, **kw):
        release.wait(60)
        return generate(*a, **kw)

    sampler.engine.generate = blocked


def test_a_thread_sampler_past_the_timeout_is_one_error_naming_the_step(tmp_path):
    s, release = _open(tmp_path, "run.resume=never"), threading.Event()
    try:
        sampler = Sampler(s.engine)
        _hang(sampler, release)
        job = sampler.start(s.engine.model, PLAN, 7, _prompts(s), [2, 2, 2], 1, **KW)
        job.timeout_s, hung = 0.3, job.thread
        with pytest.raises(OverlapTimeout, match=r"no batch for step 7 within 0\.3 s \(rollout.overlap_timeout_s\)"):
            job.wait()
        assert "\n" not in str(job.error)
        with pytest.raises(OverlapTimeout):  # and again, at once, for whoever waits next
            job.wait()
    finally:
        release.set()
        hung.join(60)  # no thread left sampling when the interpreter exits
        s.close()


def test_the_session_stops_at_the_timeout_and_still_closes(tmp_path, monkeypatch):
    release, init = threading.Event(), Sampler.__init__

    def hanging_init(self, engine):
        init(self, engine)
        _hang(self, release)

    monkeypatch.setattr(overlap.Sampler, "__init__", hanging_init)
    s = _open(tmp_path, "rollout.overlap=1", "rollout.overlap_timeout_s=0.5", "run.resume=never")
    try:
        loop.run_iteration(s)  # step 0 samples itself and starts step 1's batch, which hangs
        with pytest.raises(OverlapTimeout, match="for step 1 within 0.5 s"):
            loop.run_iteration(s)
    finally:
        s.close()  # no second wait, no error: the locks and the database are released
        release.set()
        s.ahead.sampler.last.join(60)
    assert str(s.run_dir.resolve()) not in locks._HELD  # the session's last closers ran: the run is released
