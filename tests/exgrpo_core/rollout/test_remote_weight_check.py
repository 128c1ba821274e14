"""The check after each remote push asks only for what it compares: with one replica, the float64 sums of the
norm weights from every worker through /collective_rpc into our worker extension, not /weight_checker's
sha256 of every weight (a device-to-host copy of the whole model per push). Several data-parallel replicas
(the RPC answers for the first replica's workers only) or a server without the extension: /weight_checker.

Run: .venv/bin/python -m pytest tests/exgrpo_core/rollout/test_remote_weight_check.py -q
"""

from __future__ import annotations

import pytest
import torch
from fake_vllm_server import FakeVLLMServer, cpu_transfer

from exgrpo_core.models.build import build_tiny_model, build_tiny_tokenizer
from exgrpo_core.rollout import sync as engine_sync
from exgrpo_core.rollout.remote import RemoteEngine

SHAPE = {"hidden_size": 32, "num_layers": 2, "num_heads": 4, "intermediate_size": 64}
PROBE = [1, 5, 6, 7]


@pytest.fixture()
def tok():
    return build_tiny_tokenizer()


def _setup(tok, **server_kw):
    server = FakeVLLMServer(build_tiny_model(tok, **SHAPE, seed=7), **server_kw)
    trainer = build_tiny_model(tok, **SHAPE, seed=0)
    eng = RemoteEngine(server.url, tok, params=[(n, tuple(p.shape)) for n, p in trainer.named_parameters()],
                       eos_ids=[tok.eos_token_id], weight_dtype=torch.float32, open_transfer=cpu_transfer(server))
    return server, trainer, eng


def _step(trainer):
    with torch.no_grad():  # an optimiser step moves every weight, the checked norm weights too
        for p in trainer.parameters():
            p.add_(0.05 * torch.randn_like(p))


def _checks(server) -> list[str]:
    return [p for _, p in server.requests if p in ("/collective_rpc", "/weight_checker")]


def test_one_replica_is_checked_through_the_rpc_not_the_full_digest(tok):
    server, trainer, eng = _setup(tok)
    try:
        engine_sync.push_and_check(eng, trainer, PROBE, torch.float32)
        _step(trainer)
        engine_sync.push_and_check(eng, trainer, PROBE, torch.float32)
        assert _checks(server) == ["/collective_rpc", "/collective_rpc"]
        _step(trainer)
        server.stale = True  # takes the tensors off the wire, keeps the old ones
        with pytest.raises(engine_sync.EngineSyncError, match="differ from the trainer's"):
            engine_sync.push_and_check(eng, trainer, PROBE, torch.float32)
    finally:
        server.stop()


def test_a_worker_holding_other_weights_fails_the_rpc_check(tok):
    server, trainer, eng = _setup(tok)
    try:
        eng.push_weights(trainer.named_parameters())
        names = engine_sync.norm_names(trainer)
        mine = engine_sync.trainer_checksums(trainer, names, torch.float32)
        assert engine_sync.compare_checksums(mine, eng.checksums(names)) == []
        real = server._rpc

        def two_workers(body):  # a second tensor-parallel worker whose first norm weight is off
            status, answer = real(body)
            good = answer["results"][0]
            return status, {"results": [good, {**good, names[0]: good[names[0]] + 1.0}]}

        server._rpc = two_workers
        with pytest.raises(engine_sync.EngineSyncError, match="answered for 2 workers, it has 1"):
            eng.checksums(names)
        eng.workers = 2
        assert engine_sync.compare_checksums(mine, eng.checksums(names)) == [names[0]]
    finally:
        server.stop()


@pytest.mark.parametrize("server_kw", [{"extension": False}, {"replicas": 2}])
def test_without_the_extension_or_with_replicas_the_digests_check_every_weight(tok, server_kw):
    server, trainer, eng = _setup(tok, **server_kw)
    try:
        engine_sync.push_and_check(eng, trainer, PROBE, torch.float32)
        engine_sync.push_and_check(eng, trainer, PROBE, torch.float32)
        tried = ["/collective_rpc"] if "extension" in server_kw else []  # refused once, then digests only
        assert _checks(server) == tried + ["/weight_checker", "/weight_checker"]
        _step(trainer)
        server.stale = True
        with pytest.raises(engine_sync.EngineSyncError, match="differ from the trainer's"):
            engine_sync.push_and_check(eng, trainer, PROBE, torch.float32)
    finally:
        server.stop()
