"""rollout.overlap=1 on the remote engine, against the `vllm serve` stand-in (fake_vllm_server.py): step t+1's
requests reach the server before step t's push, under the weights step t started with; the push waits for
them; the rollouts record that version; a server that changed weights under the batch is refused.

Run: .venv/bin/python -m pytest tests/exgrpo_core/rollout/test_remote_overlap.py -q
"""

from __future__ import annotations

import pytest
import torch
from sqlalchemy import select
from fake_vllm_server import FakeVLLMServer, cpu_transfer

from exgrpo_core import loop
from exgrpo_core import metrics as M
from exgrpo_core.config.load import load_config
from exgrpo_core.models import load as models
from exgrpo_core.rollout import remote
from exgrpo_core.rollout.remote import RemoteEngineError
from exgrpo_core.store.tables import Trajectory as T


def half_right(texts, answers):
    return [(1.0, "correct") if i % 2 == 0 else (0.0, "wrong") for i in range(len(texts))]


@pytest.fixture()
def server():
    model, _ = models.load_policy("tiny", seed=7)  # another run's weights until the session's push
    srv = FakeVLLMServer(model, seed=3)
    yield srv
    srv.stop()


def _open(tmp_path, server, monkeypatch, *extra):
    from exgrpo_core.run.session import open_session

    monkeypatch.setattr(remote, "require_vllm", lambda: None)  # the stand-in's transfer needs no vLLM
    monkeypatch.setattr(remote, "weight_transfer",
                        lambda kind: lambda client, params, dtype, **kw: cpu_transfer(server)(client, params, dtype))
    cfg = load_config("tiny", [f"run.output_dir={tmp_path}", f"run.db_url=sqlite:///{tmp_path / 'x.db'}",
                               "run.resume=never", "rollout.engine=remote", f"rollout.server_url={server.url}",
                               "model.dtype=float32", "rollout.max_response_tokens=4", "rollout.group_size=4",
                               "train.batch_size=8", "train.mini_batch_size=4", "buffer.start_threshold=0",
                               "run.steps=4", "train.lr=1e-3", *extra])
    torch.manual_seed(0)
    return open_session(cfg, verify=half_right)


def _trail(server) -> list[str]:
    """The server's requests as one letter each: g(enerate), p(ause), r(esume)."""
    code = {"/inference/v1/generate": "g", "/pause": "p", "/resume": "r"}
    return [code[path] for _, path in server.requests if path in code]


def test_the_next_batch_is_sent_while_this_step_trains_and_the_push_waits_for_it(tmp_path, server, monkeypatch):
    s = _open(tmp_path, server, monkeypatch, "rollout.overlap=1")
    try:
        label0 = s.engine.version  # the session's push: the weights step 0 starts with
        server.requests.clear()
        out0 = loop.run_iteration(s)
        assert out0[M.FRESH_STALENESS] == 0.0 and out0["engine/sync_logprob_gap"] < 1e-4
        job = s.ahead.job
        assert job.plan.step == 1 and job.version == 0 and job.thread is None and job.gens  # joined before the push
        trail = "".join(_trail(server))
        n = len(job.plan.fresh) + len(job.plan.replay)  # one request per prompt
        pause = trail.index("p")  # step 0's push
        assert trail[:pause].count("g") >= 8 + n and "pr" in trail[pause:]  # step 0's batch and step 1's before it
        assert s.engine.version != label0  # step 0's push landed
        plan = loop.plan_batch(s)
        assert plan is job.plan
        rollouts, stats = loop.generate(s, plan)
        assert stats[M.FRESH_STALENESS] == 1.0 and stats[M.FRESH_DROPPED] == 0.0
        assert {r.step for r in rollouts} == {0}  # sampled by the weights step 0 started with
        gaps = [abs(a - b) for r in rollouts for a, b in zip(r.behaviour_logprobs, r.sampler_logprobs)]
        assert max(gaps) > 1e-4  # rescored by the trainer one step on; the sampler's kept for the weight
    finally:
        s.close()


def test_a_run_of_overlapped_remote_steps_records_each_batchs_version(tmp_path, server, monkeypatch):
    s = _open(tmp_path, server, monkeypatch, "rollout.overlap=1")
    try:
        outs = [loop.run_iteration(s) for _ in range(3)]
        assert [o[M.FRESH_STALENESS] for o in outs] == [0.0, 1.0, 1.0]
        assert all(o["engine/sync_logprob_gap"] < 1e-4 for o in outs)
        with s.store.engine.connect() as conn:
            steps = set(conn.execute(select(T.collected_step, T.step).where(T.run_id == s.run_id)).all())
        assert steps == {(0, 0), (1, 0), (2, 1)}  # (the step training on it, the policy version sampling it)
    finally:
        s.close()


def test_a_batch_sampled_under_other_weights_is_refused(tmp_path, server, monkeypatch):
    s = _open(tmp_path, server, monkeypatch, "rollout.overlap=1")
    try:
        prompts = [s.prompt_ids(min(s.questions))]
        s.engine.generate(prompts, 2, temperature=1.0, max_new_tokens=3, expect_version=s.engine.version)
        with pytest.raises(RemoteEngineError, match="sent under exgrpo-old"):
            s.engine.generate(prompts, 2, temperature=1.0, max_new_tokens=3, expect_version="exgrpo-old")
    finally:
        s.close()


def test_colocated_vllm_with_overlap_is_refused_in_one_line(tmp_path):
    with pytest.raises(Exception, match="overlap=1 needs rollout.engine=transformers or remote: colocated"):
        load_config("tiny", ["rollout.overlap=1", "rollout.engine=vllm"])
    load_config("tiny", ["rollout.overlap=1", "rollout.engine=remote", "rollout.server_url=http://127.0.0.1:1",
                         "rollout.decoder=generate"])  # the decoder is the transformers engine's
