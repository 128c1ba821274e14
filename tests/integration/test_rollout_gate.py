"""A rollout server reachable from other machines takes weights only from a trainer holding its key.

vLLM's key guards its sampling routes only; the stand-in (fake_vllm_server.py) does the same, so a stranger
reaching `vllm serve` directly could pause it and replace or zero its weights. `exgrpo rollout-server`
refuses to listen beyond loopback without EXGRPO_ROLLOUT_API_KEY and, with one, puts flows/rollout_gate.py
in front: every route but GET /health needs the key; the trainer's pushes and samples go through.

Run: .venv/bin/python -m pytest tests/integration/test_rollout_gate.py -q
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "exgrpo_core" / "rollout"))
from fake_vllm_server import FakeVLLMServer, cpu_transfer  # noqa: E402

from exgrpo_core.models.build import build_tiny_model, build_tiny_tokenizer  # noqa: E402
from exgrpo_core.rollout.remote import RemoteEngine  # noqa: E402
from flows import rollout_gate  # noqa: E402
from flows.cli import main  # noqa: E402

SHAPE = {"hidden_size": 32, "num_layers": 2, "num_heads": 4, "intermediate_size": 64}
KEY = "rollout-key-0123"


@pytest.fixture()
def gated():
    """The stand-in on a loopback port (with vLLM's own key, as `rollout-server` starts it) behind the gate."""
    tok = build_tiny_tokenizer()
    server = FakeVLLMServer(build_tiny_model(tok, **SHAPE, seed=7), api_key=KEY, seed=3)
    gate = rollout_gate.TokenGate("127.0.0.1", 0, int(server.url.rsplit(":", 1)[1]), KEY)
    threading.Thread(target=gate.serve_forever, daemon=True).start()
    yield server, f"http://127.0.0.1:{gate.server_address[1]}", tok
    gate.shutdown()
    gate.server_close()
    server.stop()


def _call(url: str, body: dict | None = None, key: str | None = None) -> int:
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_strangers_cannot_touch_the_weights_the_trainer_can(gated):
    server, url, tok = gated
    before = server.checksums()
    for path, body in (("/pause", {}), ("/init_weight_transfer_engine", {"init_info": {}}),
                       ("/start_weight_update", {}), ("/update_weights", {"update_info": {}}),
                       ("/weight_checker", {"action": "reset"}), ("/inference/v1/generate", {"token_ids": [1]})):
        for key in (None, "wrong"):
            assert _call(url + path, body, key) == 401, (path, key)
    assert _call(url + "/weight_info", key="wrong") == 401
    assert not server.paused and server.version == "default" and server.checksums() == before
    assert ("POST", "/pause") not in server.requests and ("POST", "/weight_checker") not in server.requests

    trainer = build_tiny_model(tok, **SHAPE, seed=0)
    eng = RemoteEngine(url, tok, params=[(n, tuple(p.shape)) for n, p in trainer.named_parameters()],
                       eos_ids=[tok.eos_token_id], weight_dtype=torch.float32, api_key=KEY,
                       open_transfer=cpu_transfer(server))
    eng.push_weights(trainer.named_parameters())  # pause, transfer, resume, version check: all through the gate
    assert server.version != "default" and server.checksums() != before
    out = eng.generate([tok("1+2=")["input_ids"]], [2], temperature=0.7, max_new_tokens=4)
    assert len(out[0]) == 2
    assert _call(url + "/health") != 401  # a load balancer's probe


def test_rollout_server_beyond_loopback_needs_the_key_and_runs_behind_the_gate(capsys, monkeypatch):
    monkeypatch.delenv("EXGRPO_ROLLOUT_API_KEY", raising=False)
    assert main(["rollout-server", "--model", "m", "--host", "0.0.0.0"]) == 2
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if line.startswith("error")] == [
        "error: --host 0.0.0.0 lets other machines pause the server and replace its weights: set "
        "EXGRPO_ROLLOUT_API_KEY (the trainer sends the same; docs/scaling.md)"]

    calls = []
    monkeypatch.setenv("EXGRPO_ROLLOUT_API_KEY", KEY)
    from flows import cli_tools

    monkeypatch.setattr(cli_tools, "has_vllm", lambda python: True)
    monkeypatch.setattr(rollout_gate, "serve", lambda cmd, env, host, port, key: calls.append((cmd, host, port)) or 0)
    assert main(["rollout-server", "--model", "m", "--host", "10.0.0.5", "--port", "8123"]) == 0
    out = capsys.readouterr().out
    assert KEY not in out and "key gate at 10.0.0.5:8123" in out
    (cmd, host, port), = calls
    assert (host, port) == ("10.0.0.5", 8123) and cmd[1:5] == ["-m", "vllm.entrypoints.openai.api_server", "--model", "m"]
    inner = rollout_gate.behind_gate(cmd, "/tmp/d/vllm.sock")  # vLLM itself listens on no port
    assert "--host" not in inner and "--port" not in inner and inner[-2:] == ["--uds", "/tmp/d/vllm.sock"]


def test_behind_gate_leaves_exactly_one_private_socket():
    cmd = ["vllm", "serve", "m", "--host", "10.0.0.5", "--port", "8000", "--dtype", "bfloat16",
           "--host=0.0.0.0", "--max-num-seqs", "8", "--por", "1234", "--port=80", "--uds=/tmp/x", "--ud", "/y"]
    inner = rollout_gate.behind_gate(cmd, "/tmp/d/vllm.sock")
    assert inner == ["vllm", "serve", "m", "--dtype", "bfloat16", "--max-num-seqs", "8", "--uds", "/tmp/d/vllm.sock"]


def test_the_private_socket_folder_is_this_users_alone():
    path = rollout_gate.private_socket_path()
    folder = Path(path).parent
    try:
        assert folder.stat().st_mode & 0o777 == 0o700 and not Path(path).exists() and len(path.encode()) < 108
    finally:
        folder.rmdir()


def test_the_weight_transfer_rendezvous_listens_on_one_named_interface():
    """The trainer's TCPStore has no key: a wildcard address is refused; the port is picked on the address."""
    from pydantic import ValidationError

    from exgrpo_core.config.schema import RolloutConfig
    from exgrpo_core.rollout.remote import free_port

    for wildcard in ("0.0.0.0", "::", "[::]"):
        with pytest.raises(ValidationError, match="every interface"):
            RolloutConfig(server_group_host=wildcard)
    assert RolloutConfig(server_group_host="10.0.0.7").server_group_host == "10.0.0.7"
    port = free_port("127.0.0.1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # free there


def test_the_gate_forwards_to_vllms_unix_socket(tmp_path):
    """`serve` puts vLLM on a Unix socket (--uds); the gate reaches it there, key required."""
    import socketserver
    from http.server import BaseHTTPRequestHandler

    class Upstream(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *a):
            pass

    path = str(tmp_path / "vllm.sock")
    upstream = socketserver.UnixStreamServer(path, Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    gate = rollout_gate.TokenGate("127.0.0.1", 0, path, KEY)
    threading.Thread(target=gate.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{gate.server_address[1]}/weight_info"
    try:
        assert _call(url) == 401 and _call(url, key=KEY) == 200
    finally:
        for s in (gate, upstream):
            s.shutdown()
            s.server_close()
