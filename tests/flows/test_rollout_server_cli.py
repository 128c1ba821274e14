"""`exgrpo rollout-server` as users start it: a process that serves the model until stopped.

Run: .venv/bin/python -m pytest tests/flows/test_rollout_server_cli.py -q
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request

from exgrpo_core.models.build import build_tiny_model, build_tiny_tokenizer
from exgrpo_core.rollout.remote import RemoteEngine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_rollout_server_command_serves_until_stopped(tmp_path):
    tok = build_tiny_tokenizer()
    build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=4, intermediate_size=64, seed=1).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "rollout-server", "--model", str(tmp_path),
                             "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline, health = time.monotonic() + 120, None
        while health is None:
            assert proc.poll() is None, proc.stdout.read()
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    health = json.loads(r.read())
            except OSError:
                assert time.monotonic() < deadline, "the server did not answer within 120 s"
                time.sleep(0.5)
        assert health["backend"] == "transformers" and health["model"] == str(tmp_path) and health["version"] == 0
        out = RemoteEngine(url, tok).generate([tok("2+2=")["input_ids"]], 2, temperature=1.0, max_new_tokens=3)
        assert [len(g) for g in out] == [2]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_taken_port_is_one_clear_error(tmp_path, capsys):
    from flows.cli import main

    tok = build_tiny_tokenizer()
    build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=4, intermediate_size=64, seed=1).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["rollout-server", "--model", str(tmp_path), "--port", str(port)])
    assert code == 2
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().out
