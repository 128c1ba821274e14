"""rollout.engine=remote: a real rollout server (transformers backend) on a local port, the trainer's
RemoteEngine against it: records, weight push + checks, named errors, and training steps through it.

Run: .venv/bin/python -m pytest tests/exgrpo_core/test_rollout_remote.py -q
"""

from __future__ import annotations

import json
import urllib.request

import pytest
import torch

from exgrpo_core import loop
from exgrpo_core.config.load import load_config
from exgrpo_core.models.build import build_tiny_model, build_tiny_tokenizer
from exgrpo_core.rollout import sync as engine_sync
from exgrpo_core.rollout.remote import RemoteEngine, RemoteEngineError
from exgrpo_core.rollout.server import RolloutServer, build_backend
from exgrpo_core.run.session import open_session
from exgrpo_core.training import policy
from exgrpo_core.training.batch import collate
from exgrpo_core.types import Rollout

SHAPE = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "intermediate_size": 128}  # the tiny preset's


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A server started from a saved tiny model whose weights differ from the trainer's (seed 7)."""
    folder = tmp_path_factory.mktemp("server-model")
    tok = build_tiny_tokenizer()
    build_tiny_model(tok, **SHAPE, seed=7).save_pretrained(folder)
    tok.save_pretrained(folder)
    backend, tokenizer = build_backend(str(folder), "transformers", batch_size=16)
    srv = RolloutServer(backend, tokenizer, model_name="tiny-seed7", port=0).start()
    yield srv
    srv.stop()


@pytest.fixture()
def trainer_model():
    tok = build_tiny_tokenizer()
    return build_tiny_model(tok, **SHAPE, seed=0), tok


def _post(url: str, body: bytes) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=body, method="POST")
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_generations_carry_the_servers_logprobs_for_per_prompt_counts(server, trainer_model):
    _, tok = trainer_model
    eng = RemoteEngine(server.url, tok)
    prompts = [tok("1+2=")["input_ids"], tok("31+4=")["input_ids"]]
    torch.manual_seed(0)
    out = eng.generate(prompts, [3, 2], temperature=0.8, max_new_tokens=4)
    assert [len(g) for g in out] == [3, 2]
    rows = [Rollout("q", p, g.response_ids, g.logprobs, g.text, g.truncated, 0) for p, grp in zip(prompts, out)
            for g in grp]
    assert all(1 <= len(r.response_ids) <= 4 for r in rows)
    batch = collate(rows, [0.0] * len(rows), eng.pad_id)
    with torch.no_grad():  # the server's model scores its own samples as it sampled them
        logp, _ = policy.token_logprobs_and_entropy(server.backend.model, batch.input_ids, batch.attention_mask,
                                                    micro_batch_size=8, temperature=0.8)
    torch.testing.assert_close(logp.cpu()[batch.response_mask], batch.old_logprobs[batch.response_mask],
                               atol=1e-4, rtol=1e-4)
    torch.manual_seed(0)
    again = eng.generate(prompts, [3, 2], temperature=0.8, max_new_tokens=4)
    assert [[g.response_ids for g in grp] for grp in again] == [[g.response_ids for g in grp] for grp in out]


@pytest.mark.parametrize("transport", ["http", "gloo"])
def test_weight_push_makes_the_server_the_trainer_and_the_checks_prove_it(server, trainer_model, transport):
    model, tok = trainer_model
    eng = RemoteEngine(server.url, tok, chunk_bytes=20_000, transport=transport)  # several chunks
    names = engine_sync.norm_names(model)
    mine = engine_sync.trainer_checksums(model, names, torch.float32)
    with torch.no_grad():
        server.backend.model.model.norm.weight.add_(0.5)  # make sure they differ before the push
    assert engine_sync.compare_checksums(mine, eng.checksums(names))
    version = server.version
    stats = engine_sync.push_and_check(eng, model, [1, 5, 6, 7, 8, 9], eng.weight_dtype)
    assert server.version > version + 1  # more than one chunk went over
    assert stats["engine/sync_logprob_gap"] < 1e-5
    for a, b in zip(model.parameters(), server.backend.model.parameters()):
        assert torch.equal(a.cpu(), b.cpu())  # the server's model is on its GPU, if any


def test_bad_requests_and_a_missing_server_get_named_errors(server, trainer_model):
    _, tok = trainer_model
    code, body = _post(server.url + "/generate", json.dumps({"prompts": [[1, 2]], "max_new_tokens": 2}).encode())
    assert code == 400 and "temperature" in body["error"]
    code, body = _post(server.url + "/generate", b"not json")
    assert code == 400 and "not JSON" in body["error"]
    code, body = _post(server.url + "/weights", b"\x00garbage")
    assert code == 400 and "safetensors" in body["error"]
    code, body = _post(server.url + "/nope", b"{}")
    assert code == 404
    fresh = RolloutServer(server.backend, server.tokenizer, model_name="fresh", port=0).start()
    try:  # no trainer has asked it for a weight group yet
        code, body = _post(fresh.url + "/weights_stream", json.dumps({"seq": 1, "tensors": []}).encode())
        assert code == 400 and "POST /group first" in body["error"]
    finally:
        fresh.stop()
    for transport in ("http", "gloo"):  # refused before anything is broadcast: no process waits
        eng = RemoteEngine(server.url, tok, transport=transport)
        with pytest.raises(RemoteEngineError, match="unknown parameter name"):
            eng.push_weights([("not.a.param", torch.zeros(2))])
        with pytest.raises(RemoteEngineError, match="shape"):
            eng.push_weights([("model.norm.weight", torch.zeros(3))])
        assert eng.push_weights([("model.norm.weight", torch.ones(SHAPE["hidden_size"]))]) == 1
        assert torch.equal(server.backend.model.model.norm.weight.cpu(), torch.ones(SHAPE["hidden_size"]))
    with pytest.raises(RemoteEngineError, match="not reachable"):
        RemoteEngine("http://127.0.0.1:9", tok, timeout_s=5)
    unreachable = RemoteEngine(server.url, tok, transport="gloo", group_host="192.0.2.1", timeout_s=3)  # TEST-NET
    with pytest.raises(RemoteEngineError, match="server_group_host"):
        unreachable.push_weights([("model.norm.weight", torch.ones(SHAPE["hidden_size"]))])
    assert server.thread.is_alive()  # none of it stopped the server


def test_config_needs_the_server_url():
    with pytest.raises(Exception, match="server_url"):
        load_config("tiny", ["rollout.engine=remote"])


@pytest.mark.parametrize("transport", ["http", "gloo"])
def test_training_steps_sample_on_the_server_and_push_after_each(server, tmp_path, transport):
    with torch.no_grad():
        server.backend.model.model.norm.weight.add_(1.0)  # another run's weights
    cfg = load_config("tiny", [f"run.output_dir={tmp_path}", f"run.db_url=sqlite:///{tmp_path / 'x.db'}",
                               "rollout.engine=remote", f"rollout.server_url={server.url}", "run.resume=never",
                               "rollout.max_response_tokens=2", f"rollout.server_weight_transport={transport}"])
    torch.manual_seed(0)
    s = open_session(cfg)
    try:
        assert isinstance(s.engine, RemoteEngine)
        for a, b in zip(s.model.parameters(), server.backend.model.parameters()):  # pushed when opened
            assert torch.equal(a.detach().cpu(), b.cpu())
        for _ in range(2):
            before = server.version
            stats = loop.run_iteration(s)
            assert server.version > before  # pushed after the optimiser step
            assert stats["engine/sync_logprob_gap"] < 1e-5
            assert stats["rollout/responses"] > 0
        for a, b in zip(s.model.parameters(), server.backend.model.parameters()):
            assert torch.equal(a.detach().cpu(), b.cpu())
    finally:
        s.close()
