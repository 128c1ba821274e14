"""rollout.overlap = 1 (issue 47, first increment): step t+1 samples from the weights step t started with,
records that version, drops a batch older than the bound, and a resumed run trains as the uninterrupted one."""

from __future__ import annotations

import pytest
import torch

from exgrpo_core import loop
from exgrpo_core import metrics as M
from exgrpo_core.config.load import load_config
from exgrpo_core.run.session import open_session


def half_right(texts, answers):
    return [(1.0, "correct") if i % 2 == 0 else (0.0, "wrong") for i in range(len(texts))]


def _cfg(tmp_path, *extra):
    return load_config("tiny", [f"run.output_dir={tmp_path}", f"run.db_url=sqlite:///{tmp_path / 'x.db'}",
                                "rollout.max_response_tokens=4", "rollout.group_size=4", "train.batch_size=8",
                                "train.mini_batch_size=4", "buffer.start_threshold=0", "run.steps=4",
                                "train.lr=1e-3", *extra])


def _open(tmp_path, *extra):
    torch.manual_seed(0)
    return open_session(_cfg(tmp_path, *extra), verify=half_right)


def _weights(s):
    return {k: v.detach().clone() for k, v in s.accelerator.unwrap_model(s.model).state_dict().items()}


SAMPLERS = ["thread", "process"]  # rollout.overlap_sampler


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_overlap_samples_step_t_plus_1_from_the_weights_step_t_started_with(tmp_path, sampler):
    s = _open(tmp_path, "rollout.overlap=1", "run.resume=never", f"rollout.overlap_sampler={sampler}")
    try:
        start = _weights(s)
        out0 = loop.run_iteration(s)  # step 0 samples now, and starts step 1's batch before training
        assert M.FRESH_STALENESS in out0 and out0[M.FRESH_STALENESS] == 0.0
        job = s.ahead.job
        assert job.plan.step == 1 and job.version == 0
        copy = s.ahead.sampler.engine.model.state_dict()
        assert all(torch.equal(copy[k], v) for k, v in start.items())  # the pre-step-0 weights
        assert not all(torch.equal(_weights(s)[k], v) for k, v in start.items())  # the trainer moved on
        plan = loop.plan_batch(s)
        assert plan is job.plan
        rollouts, stats = loop.generate(s, plan)
        assert stats[M.FRESH_STALENESS] == 1.0 and stats[M.FRESH_DROPPED] == 0.0
        assert {r.step for r in rollouts} == {0}  # the policy version that sampled them
    finally:
        s.close()


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_a_batch_older_than_the_bound_is_dropped_and_sampled_again(tmp_path, sampler):
    s = _open(tmp_path, "rollout.overlap=1", "rollout.max_staleness=0", "run.resume=never",
              f"rollout.overlap_sampler={sampler}")
    try:
        loop.run_iteration(s)
        out = loop.run_iteration(s)
        assert out[M.FRESH_DROPPED] == 1.0 and out[M.FRESH_STALENESS] == 0.0
        stale = {f.name: f.limit for f in loop.check_monitors(s, 1, out, store=False) if "stale" in f.name}
        assert stale == {"stale_dropped": 0.0}  # a warning; the batch trained on is on-policy
        fired = loop.check_monitors(s, 1, {**out, M.FRESH_STALENESS: 1.0}, store=False)
        assert [(f.name, f.limit) for f in fired if f.name == "fresh_staleness"] == [("fresh_staleness", 0.0)]
    finally:
        s.close()


def test_overlap_off_is_the_synchronous_loop(tmp_path):
    s = _open(tmp_path, "run.resume=never")
    try:
        out = loop.run_iteration(s)
        assert s.ahead is None and M.FRESH_STALENESS not in out
    finally:
        s.close()


def _run(tmp_path, kill_after: int | None, sampler: str = "thread"):
    """Four overlapped steps, checkpointing each; with `kill_after`, the session is dropped after that
    step's checkpoint (its batch in flight lost with it) and a new one resumes."""
    sampler = f"rollout.overlap_sampler={sampler}"
    s = _open(tmp_path, "rollout.overlap=1", sampler)
    texts = []
    while s.step < 4:
        out = loop.run_iteration(s)
        texts.append(out[M.RESPONSE_LENGTH])
        s.save()
        if kill_after is not None and s.step == kill_after + 1:
            s.close()
            s = _open(tmp_path, "rollout.overlap=1", "run.resume=must", sampler)
            assert s.resumed_from == kill_after and s.ahead.job.plan.step == kill_after + 1
            kill_after = None
    w = _weights(s)
    s.close()
    return texts, w


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_a_resumed_overlap_run_reaches_the_uninterrupted_runs_weights(tmp_path, sampler):
    texts_a, w_a = _run(tmp_path / "a", None, sampler)
    texts_b, w_b = _run(tmp_path / "b", 1, sampler)
    assert texts_a == pytest.approx(texts_b)
    assert all(torch.equal(w_a[k], w_b[k]) for k in w_a)


def test_overlap_on_another_engine_is_refused_in_one_line(tmp_path):
    with pytest.raises(Exception, match="overlap=1 needs rollout.engine=transformers or remote: colocated"):
        _cfg(tmp_path, "rollout.overlap=1", "rollout.engine=vllm")
    with pytest.raises(Exception, match="overlap needs the eager or static decoder"):
        _cfg(tmp_path, "rollout.overlap=1", "rollout.decoder=generate")


def test_overlap_under_several_processes_is_refused_before_anything_is_built(tmp_path, monkeypatch):
    from exgrpo_core.config.load import ConfigError
    from exgrpo_core.run.session import check_settings

    cfg = _cfg(tmp_path, "rollout.overlap=1")
    monkeypatch.setenv("WORLD_SIZE", "1")
    check_settings(cfg)
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ConfigError, match="overlap=1 runs in one process .*starts 4: set rollout.overlap=0"):
        check_settings(cfg)
    check_settings(_cfg(tmp_path, "rollout.overlap=0"))  # the synchronous loop runs under torchrun


def test_rescored_stale_rollouts_keep_the_samplers_log_probs_for_the_importance_weight(tmp_path):
    s = _open(tmp_path, "rollout.overlap=1", "rollout.rescore=always", "loss.tis_cap=2.0", "run.resume=never")
    try:
        loop.run_iteration(s)
        plan = loop.plan_batch(s)
        rollouts, stats = loop.generate(s, plan)
        gaps = [abs(a - b) for r in rollouts for a, b in zip(r.behaviour_logprobs, r.sampler_logprobs)]
        assert max(gaps) > 1e-4  # the trainer moved one step past the sampler's weights
        assert stats[M.IS_FRESH_SEQ_RATIO] != pytest.approx(1.0, abs=1e-6)
    finally:
        s.close()
