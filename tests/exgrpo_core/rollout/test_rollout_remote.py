"""rollout.engine=remote against the `vllm serve` stand-in (fake_vllm_server.py): records, processed log-probs,
a weight push that lands under a new version, the sync check failing on stale weights, the API key, and the
one-line error when vLLM is missing. The NCCL transfer itself is replaced by fake_vllm_server.cpu_transfer.

Run: .venv/bin/python -m pytest tests/exgrpo_core/rollout/test_rollout_remote.py -q
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from fake_vllm_server import FakeVLLMServer, cpu_transfer

from exgrpo_core.models.build import build_tiny_model, build_tiny_tokenizer
from exgrpo_core.rollout import remote
from exgrpo_core.rollout import sync as engine_sync
from exgrpo_core.rollout.remote import RemoteEngine, RemoteEngineError
from exgrpo_core.rollout.vllm_engine import VLLMUnavailable
from exgrpo_core.types import Generation

SHAPE = {"hidden_size": 32, "num_layers": 2, "num_heads": 4, "intermediate_size": 64}


@pytest.fixture()
def tok():
    return build_tiny_tokenizer()


@pytest.fixture()
def server(tok):
    """The server holds another run's weights (seed 7) until the first push."""
    srv = FakeVLLMServer(build_tiny_model(tok, **SHAPE, seed=7), api_key="k3y", seed=3)
    yield srv
    srv.stop()


def _engine(server, model, tok, **kw) -> RemoteEngine:
    return RemoteEngine(server.url, tok, params=[(n, tuple(p.shape)) for n, p in model.named_parameters()],
                        eos_ids=[tok.eos_token_id], weight_dtype=torch.float32, api_key=kw.pop("api_key", "k3y"),
                        open_transfer=cpu_transfer(server), **kw)


def test_generations_have_the_other_engines_shape_and_processed_logprobs(server, tok):
    trainer = build_tiny_model(tok, **SHAPE, seed=0)
    eng = _engine(server, trainer, tok)
    eng.push_weights(trainer.named_parameters())
    prompts = [tok("1+2=")["input_ids"], tok("31+4=")["input_ids"], tok("9=")["input_ids"]]
    out = eng.generate(prompts, [2, 1, 3], temperature=0.7, max_new_tokens=6)
    assert [len(g) for g in out] == [2, 1, 3]
    for prompt, group in zip(prompts, out):
        for g in group:
            assert isinstance(g, Generation) and g.entropies == []
            assert len(g.response_ids) == len(g.logprobs) and 0 < len(g.response_ids) <= 6
            assert g.truncated == (g.response_ids[-1] != tok.eos_token_id)
            assert g.text == tok.decode(g.response_ids, skip_special_tokens=True)
            with torch.no_grad():  # the trainer's tempered log-probs of the sampled tokens (same weights now)
                logits = trainer(torch.tensor([prompt + g.response_ids])).logits[0, len(prompt) - 1:-1].float()
            want = torch.log_softmax(logits / 0.7, -1).gather(-1, torch.tensor(g.response_ids)[:, None])[:, 0]
            assert torch.allclose(torch.tensor(g.logprobs), want, atol=1e-5)
    asked = [p for _, p in server.requests if p == "/inference/v1/generate"]
    assert len(asked) == 1 + 3  # the start-up check, then one request per prompt


def test_a_push_lands_under_a_new_version_and_passes_the_sync_check(server, tok):
    trainer = build_tiny_model(tok, **SHAPE, seed=0)
    eng = _engine(server, trainer, tok)
    assert server.init_info is None
    assert eng.push_weights(trainer.named_parameters()) == len(list(trainer.parameters()))
    first = server.version
    assert first == eng.version and first.startswith("exgrpo-") and not server.paused
    for a, b in zip(trainer.parameters(), server.model.parameters()):
        assert torch.equal(a, b)
    with torch.no_grad():
        for p in trainer.parameters():
            p.add_(0.05 * torch.randn_like(p))
    stats = engine_sync.push_and_check(eng, trainer, [1, 5, 6, 7], torch.float32)
    assert stats["engine/sync_logprob_gap"] < 1e-5 and server.version != first
    assert server.init_info["world_size"] == 2  # initialised once, for the trainer and one worker
    assert ("POST", "/pause") in server.requests and ("POST", "/resume") in server.requests


def test_stale_weights_on_the_server_stop_the_run(server, tok):
    trainer = build_tiny_model(tok, **SHAPE, seed=0)
    eng = _engine(server, trainer, tok)
    server.stale = True  # takes the tensors off the wire, keeps sampling from the old ones
    with torch.no_grad():  # an optimiser step moves every weight, the checked norm weights too
        for p in trainer.parameters():
            p.add_(0.05 * torch.randn_like(p))
    with pytest.raises(engine_sync.EngineSyncError, match="differ from the trainer's after a push"):
        engine_sync.push_and_check(eng, trainer, [1, 5, 6, 7], torch.float32)


def test_a_replica_that_missed_the_push_fails_the_check(server, tok):
    trainer = build_tiny_model(tok, **SHAPE, seed=0)
    server.replicas = 2  # two data-parallel replicas: the digests of both are checked...
    eng = _engine(server, trainer, tok)
    eng.push_weights(trainer.named_parameters())
    names = engine_sync.norm_names(trainer)
    assert set(eng.checksums(names)) == set(names)
    digests = server.checksums
    server.checksums = lambda: {k: ("0" * 64 if k.startswith("dp1:") else v) for k, v in digests().items()}
    assert eng.checksums(names) == {}  # ...holding other bytes


def test_samples_from_another_weight_version_are_refused(server, tok):
    trainer = build_tiny_model(tok, **SHAPE, seed=0)
    eng = _engine(server, trainer, tok)
    eng.push_weights(trainer.named_parameters())
    eng.generate([[1, 5]], 1, temperature=1.0, max_new_tokens=2)
    server.version = "default"  # e.g. the server restarted from its checkpoint
    with pytest.raises(RemoteEngineError, match="labelled \\['default'\\]"):
        eng.generate([[1, 5]], 1, temperature=1.0, max_new_tokens=2)


def test_a_wrong_api_key_is_refused_with_the_fix_named(server, tok):
    trainer = build_tiny_model(tok, **SHAPE, seed=0)
    with pytest.raises(RemoteEngineError, match="HTTP 401.*EXGRPO_ROLLOUT_API_KEY"):
        _engine(server, trainer, tok, api_key="wrong")
    with pytest.raises(RemoteEngineError, match="HTTP 401"):
        _engine(server, trainer, tok, api_key=None)


def test_a_server_without_the_needed_routes_is_named(tok):
    srv = FakeVLLMServer(build_tiny_model(tok, **SHAPE, seed=7))
    real = srv.handle
    srv.handle = lambda m, p, q, b: (404, {"detail": "Not Found"}) if p == "/get_world_size" else real(m, p, q, b)
    try:
        with pytest.raises(RemoteEngineError, match="VLLM_SERVER_DEV_MODE=1"):
            _engine(srv, build_tiny_model(tok, **SHAPE), tok, api_key=None)
        srv.handle = lambda m, p, q, b: ((403, {"error": {"message": "Scale-out endpoints are disabled."}})
                                         if p.startswith("/inference") else real(m, p, q, b))
        with pytest.raises(RemoteEngineError, match="--enable-scale-out"):
            _engine(srv, build_tiny_model(tok, **SHAPE), tok, api_key=None)
    finally:
        srv.stop()


def test_an_unreachable_server_is_one_clear_error(tok):
    with pytest.raises(RemoteEngineError, match="not reachable.*exgrpo rollout-server"):
        RemoteEngine(f"http://127.0.0.1:{remote.free_port()}", tok, params=[], eos_ids=[2], timeout_s=5)


def test_without_vllm_the_session_stops_before_loading_the_model(tmp_path, monkeypatch):
    from exgrpo_core.config.load import load_config
    from exgrpo_core.models import load as models
    from exgrpo_core.run.session import open_worker

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    monkeypatch.setattr(models, "load_policy", lambda *a, **k: pytest.fail("the model was loaded first"))
    cfg = load_config("tiny", ["rollout.engine=remote", "rollout.server_url=http://127.0.0.1:1"])
    with pytest.raises(VLLMUnavailable, match=r"pip install exgrpo\[vllm\]"):
        open_worker(cfg, None, None, tmp_path)


def test_the_nccl_transfer_needs_vllm(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(VLLMUnavailable, match=r"pip install exgrpo\[vllm\]"):
        remote.nccl_transfer(remote.ServerClient("http://127.0.0.1:1"), [], torch.float32)


def test_removed_config_keys_name_their_replacement():
    from exgrpo_core.config.load import ConfigError, load_config

    with pytest.raises((ConfigError, ValueError), match="vLLM's NCCL weight-transfer engine"):
        load_config("tiny", ["rollout.server_weight_transport=nccl"])
