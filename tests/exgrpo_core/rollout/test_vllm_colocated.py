"""Colocated vLLM engines with one and several training processes, on CPU through a stand-in for the
`vllm` package (fake_vllm.py: our VLLMEngine, WeightSyncExtension and the team's plumbing are real;
the sampling maths is a Hugging Face model). The real engine runs in tests/vllm_real (vLLM's CPU build:
log-probs, pushes and their call sequence, two processes with TP 1) and test_rollout_vllm.py (gpu); the
stand-in stays for what the CPU build cannot show: sleep mode's release, exact resume, TP 2, FSDP2.

- the engine arguments (external launcher and one seed per tensor-parallel group with several processes,
  processed log-probs, no per-request seed unless exact resume is asked for);
- (the log-probs of the distribution the tokens were drawn from: against the real engine, tests/vllm_real);
- sleep level 2: the push wakes only the weights, the KV cache wakes for sampling, stale weights refused;
- exact resume: samples seeded from torch's RNG (a resumed run samples what an uninterrupted one does),
  pushes streamed in chunks, a stale engine caught;
- training steps through the loop: the engine holds the trainer's weights after every step, and
  with sleep mode it sleeps while the trainer trains;
- two gloo processes (replicated and FSDP2; tensor-parallel groups of 1 and 2): a group's ranks sample
  the same prompts with the same seeds, groups split the prompts, every engine gets the whole weights.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import fake_vllm
from exgrpo_core import loop
from exgrpo_core.config.load import load_config
from exgrpo_core.models.build import build_tiny_model, build_tiny_tokenizer
from exgrpo_core.rollout import sync as engine_sync
from exgrpo_core.rollout.vllm_engine import VLLMEngine
from spawn_helpers import as_rank, run_two
from vllm_sequences import PUSH_AND_CHECK


@pytest.fixture
def vllm_stand_in(monkeypatch):
    names = ("vllm", "vllm.inputs", "vllm.platforms", "vllm.model_executor.model_loader.reload")
    for name in names:
        monkeypatch.delitem(sys.modules, name, raising=False)
    fake_vllm.install()
    fake_vllm.LLM.instances.clear()
    with fake_vllm.cuda():
        yield
    for name in names:  # the stand-in leaves with the test (monkeypatch then puts back what was there)
        sys.modules.pop(name, None)


@pytest.fixture
def folder(tmp_path):
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, seed=0)
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    return str(tmp_path / "m"), model, tok


def test_engine_arguments_for_one_and_several_processes(vllm_stand_in, folder, monkeypatch):
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    path, _, tok = folder
    one = VLLMEngine(path, tok, tensor_parallel_size=2, seed=7)
    several = VLLMEngine(path, tok, tensor_parallel_size=2, seed=8, distributed=True)
    assert "distributed_executor_backend" not in one.llm.kwargs and one.group_size == 1
    assert several.llm.kwargs["distributed_executor_backend"] == "external_launcher"
    assert several.group_size == 2 and several.llm.kwargs["seed"] == 8
    assert several.llm.kwargs["tensor_parallel_size"] == 2
    assert one.llm.kwargs["logprobs_mode"] == "processed_logprobs"  # vLLM's default is before temperature
    one.generate([[1, 5, 6], [1, 7]], 2, temperature=1.0, max_new_tokens=3)
    assert [p.seed for p in one.llm.params] == [None, None]  # the engine's seed: vLLM's batched sampler
    assert "VLLM_BATCH_INVARIANT" not in __import__("os").environ


def test_the_engine_seed_makes_draws_repeatable(vllm_stand_in, folder):
    path, _, tok = folder
    draws = [[[g.response_ids for g in grp] for grp in VLLMEngine(path, tok, seed=s).generate(
        [[1, 5, 6], [1, 7]], 2, temperature=1.0, max_new_tokens=6)] for s in (3, 3, 4)]
    assert draws[0] == draws[1] != draws[2]


def test_sleep_releases_everything_and_wakes_by_tag(vllm_stand_in, folder):
    path, model, tok = folder
    eng = VLLMEngine(path, tok, sleep=True)
    assert eng.llm.kwargs["enable_sleep_mode"] is True
    eng.generate([[1, 5, 6]], 2, temperature=1.0, max_new_tokens=3)
    assert eng.llm.calls == ["sleep(2)"] and eng.llm.asleep == {"weights", "kv_cache"}
    with pytest.raises(RuntimeError, match="push first"):  # level 2 discarded the weights: never sample from them
        eng.generate([[1, 5, 6]], 1, temperature=1.0, max_new_tokens=3)
    stats = engine_sync.push_and_check(eng, model, [1, 5, 6, 7], torch.float32)
    assert stats["engine/sync_logprob_gap"] < 1e-6
    assert eng.llm.calls[1:] == PUSH_AND_CHECK  # the real engine's sequence (tests/vllm_real)
    eng.generate([[1, 5, 6]], 2, temperature=1.0, max_new_tokens=3)
    assert eng.llm.calls[-1] == "sleep(2)"


def test_exact_resume_seeds_requests_from_torchs_rng(vllm_stand_in, folder, monkeypatch):
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    path, _, tok = folder
    eng = VLLMEngine(path, tok, exact_resume=True)
    assert __import__("os").environ["VLLM_BATCH_INVARIANT"] == "1"
    prompts = [[1, 5, 6], [1, 7]]

    def sample(seed):
        torch.manual_seed(seed)
        return [[g.response_ids for g in grp] for grp in eng.generate(prompts, [3, 2], temperature=1.0,
                                                                       max_new_tokens=6)]

    first = sample(3)
    assert [len(g) for g in first] == [3, 2]
    assert sample(3) == first  # same torch state (a checkpoint's): same samples
    assert sample(4) != first


def test_push_streams_chunks_and_a_stale_engine_is_caught(vllm_stand_in, folder):
    path, model, tok = folder
    eng = VLLMEngine(path, tok, chunk_bytes=4096)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    stats = engine_sync.push_and_check(eng, model, [1, 5, 6, 7], torch.float32)
    assert stats["engine/sync_logprob_gap"] < 1e-6
    assert eng.llm.rpc_calls.count("exgrpo_load_weights") > 1  # several chunks
    for (n, a), (_, b) in zip(model.named_parameters(), eng.llm.model.named_parameters()):
        assert torch.equal(a, b), n
    eng.llm.worker.exgrpo_load_weights = lambda named: len(named)  # a push that does not land
    with torch.no_grad():
        model.model.norm.weight.add_(1.0)
    with pytest.raises(engine_sync.EngineSyncError, match="differ from the trainer"):
        engine_sync.push_and_check(eng, model, [1, 5, 6, 7], torch.float32)


def _cfg(tmp_path, *extra):
    tmp_path = Path(tmp_path)
    return load_config("tiny", [f"run.output_dir={tmp_path}", f"run.db_url=sqlite:///{tmp_path / 'x.db'}",
                                "rollout.engine=vllm", "run.resume=never", "rollout.max_response_tokens=2", *extra])


@pytest.mark.parametrize("sleep", [True])  # without sleep: against the real engine (tests/vllm_real)
def test_training_steps_push_to_the_engine_after_each(vllm_stand_in, tmp_path, sleep):
    from exgrpo_core.run.session import open_session

    s = open_session(_cfg(tmp_path, f"rollout.vllm_sleep={sleep}"))
    asleep_in_training = []
    optimise = s.team.worker.optimise
    s.team.worker.optimise = lambda args: asleep_in_training.append(bool(s.engine.llm.asleep)) or optimise(args)
    try:
        assert isinstance(s.engine, VLLMEngine) and (tmp_path / "tiny" / "vllm_base" / "config.json").exists()
        for _ in range(2):
            stats = loop.run_iteration(s)
            assert stats["engine/sync_logprob_gap"] < 1e-5 and stats["rollout/responses"] > 0
        assert asleep_in_training == [sleep, sleep]  # sleep mode: the engine's memory is free while training
        assert not s.engine.llm.asleep  # the weights woken for the push, the KV cache for the probe
        for (n, a), (_, b) in zip(s.model.named_parameters(), s.engine.llm.model.named_parameters()):
            assert torch.equal(a.detach().cpu(), b.cpu()), n  # the stand-in keeps CPU weights
    finally:
        s.close()


def test_with_exact_resume_a_resumed_run_samples_what_an_uninterrupted_one_does(vllm_stand_in, tmp_path,
                                                                                monkeypatch):
    from exgrpo_core.run.session import open_session

    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    cfg = _cfg(tmp_path, "run.resume=auto", "rollout.vllm_exact_resume=true")
    s = open_session(cfg)
    try:
        for _ in range(2):
            loop.run_iteration(s)
        s.save()  # after step 1
        llm = fake_vllm.LLM.instances[-1]
        mark = len(llm.sampled)
        loop.run_iteration(s)
        uninterrupted = llm.sampled[mark:]
    finally:
        s.close()
    s = open_session(cfg)  # resumes after step 1 (a new engine; the database rolled back)
    try:
        assert s.step == 2
        loop.run_iteration(s)
        assert fake_vllm.LLM.instances[-1].sampled == uninterrupted
    finally:
        s.close()


def _spawned(rank: int, tmp: str, tp: int, sharding: str, port: int, out):
    as_rank(rank, port, out, _run_rank, tmp, tp, sharding)


def _run_rank(rank: int, tmp: str, tp: int, sharding: str) -> dict:
    from exgrpo_core.run import session as S

    fake_vllm.install()
    cfg = _cfg(tmp, f"rollout.vllm_tensor_parallel_size={tp}", f"train.sharding={sharding}")

    gaps, final = [], None
    with fake_vllm.cuda():
        if rank == 0:
            s = S.open_session(cfg)
            try:
                for _ in range(2):
                    gaps.append(loop.run_iteration(s)["engine/sync_logprob_gap"])
                state = s.team.model_state() or s.accelerator.unwrap_model(s.model).state_dict()
                final = {k: float(v.double().sum()) for k, v in state.items()}
            finally:
                s.close()
        else:
            S.run_follower(cfg)
    llm = fake_vllm.LLM.instances[0]
    engine = {k: float(v.double().sum()) for k, v in llm.model.state_dict().items()}
    return {"prompts": llm.prompts, "sampled": llm.sampled, "kwargs": llm.kwargs, "gaps": gaps,
            "final": final, "engine": engine}


@pytest.mark.parametrize("tp,sharding", [(2, "replicate"), (1, "fsdp2"), (2, "fsdp2")])
def test_two_processes_with_colocated_engines(tmp_path, tp, sharding):
    items, codes = run_two(_spawned, str(tmp_path), tp, sharding)
    got = dict(items)
    assert not [r["error"] for r in got.values() if "error" in r]
    assert codes == [0, 0]
    zero, one = got[0], got[1]
    assert zero["kwargs"]["distributed_executor_backend"] == "external_launcher"
    if tp == 2:  # one engine over both ranks: same prompts, same seeds, same samples
        assert zero["kwargs"]["seed"] == one["kwargs"]["seed"]
        assert zero["prompts"] == one["prompts"] and zero["sampled"] == one["sampled"]
    else:  # two engines: each samples its own share
        assert zero["kwargs"]["seed"] != one["kwargs"]["seed"]
        assert zero["prompts"] and one["prompts"] and zero["prompts"] != one["prompts"]
    assert len(zero["gaps"]) == 2 and max(zero["gaps"]) < 1e-5
    for engine in (zero["engine"], one["engine"]):  # every process's engine holds the trained weights
        for name, total in engine.items():
            assert total == pytest.approx(zero["final"][name], rel=1e-6, abs=1e-6), name


def test_a_group_size_that_does_not_divide_the_processes_is_named(monkeypatch, tmp_path):
    from exgrpo_core.config.load import ConfigError
    from exgrpo_core.run.session import open_worker
    from exgrpo_core.training import distributed as D

    monkeypatch.setattr(D, "topology", lambda: D.Topology(rank=0, world=3))
    with pytest.raises(ConfigError, match="vllm_tensor_parallel_size=2 must divide the 3 training processes"):
        open_worker(_cfg(tmp_path, "rollout.vllm_tensor_parallel_size=2"), None, None, tmp_path)


def test_the_trainer_and_the_engine_read_one_context(vllm_stand_in, tmp_path):
    """model.hf_overrides reach the trainer's config and vLLM's (`hf_overrides`, applied by config.update as
    vLLM does); max_model_len = prompt + the longest response fits both."""
    from exgrpo_core.run.session import open_session

    rope = {"rope_type": "default", "rope_theta": 20000.0}
    s = open_session(_cfg(tmp_path, "rollout.max_prompt_tokens=1024", "rollout.max_response_tokens=1100",
                          f"model.hf_overrides={{max_position_embeddings: 4096, rope_parameters: {rope}}}"))
    try:
        trainer, engine = s.model.config, s.engine.llm.llm_engine.model_config.hf_config
        assert trainer.max_position_embeddings == engine.max_position_embeddings == 4096
        assert trainer.rope_parameters == engine.rope_parameters == rope
        assert s.engine.llm.kwargs["max_model_len"] == 2124 <= engine.max_position_embeddings
        assert s.engine.llm.kwargs["hf_overrides"]["max_position_embeddings"] == 4096
    finally:
        s.close()


@pytest.mark.parametrize("override,message", [
    ("rollout.max_response_tokens=1100", r"1024 \+ 1100 = 2124 tokens\) exceed tiny's max_position_embeddings \(2048\)"),
    ("model.hf_overrides={rope_theta: 20000.0}", "set model.hf_overrides.rope_parameters instead"),
])
def test_a_context_that_does_not_fit_is_one_line_before_the_model_loads(tmp_path, monkeypatch, override, message):
    from exgrpo_core.config.load import ConfigError
    from exgrpo_core.models import load as models
    from exgrpo_core.run.session import open_session

    monkeypatch.setattr(models, "load_policy", lambda *a, **k: pytest.fail("loaded the model first"))
    with pytest.raises(ConfigError, match=message):
        open_session(load_config("tiny", [f"run.output_dir={tmp_path}", "rollout.max_prompt_tokens=1024", override]))
