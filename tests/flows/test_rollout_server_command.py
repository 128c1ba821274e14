"""`exgrpo rollout-server` is a thin wrapper over vLLM's server (what `vllm serve` runs, started as a module so
that vLLM's CPU build serves too): the command it prints (and runs) has the flags rollout.engine=remote needs,
and without vLLM it stops with one line naming the install.

Run: .venv/bin/python -m pytest tests/flows/test_rollout_server_command.py -q
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from flows import cli_tools
from flows.cli import main

CONTRACT = json.loads((Path(__file__).resolve().parents[2] / "exgrpo_core" / "rollout" / "vllm_contract.json")
                      .read_text())


def test_dry_run_prints_the_vllm_serve_command(capsys, monkeypatch):
    monkeypatch.setenv("EXGRPO_ROLLOUT_API_KEY", "s3cret-rollout-key-16")
    code = main(["rollout-server", "--model", "Qwen/Qwen2.5-Math-7B", "--host", "10.0.0.5", "--port", "8000",
                 "--tensor-parallel-size", "2", "--data-parallel-size", "4", "--max-model-len", "9216", "--dry-run",
                 "--", "--max-num-seqs", "512"])
    out = capsys.readouterr().out
    assert code == 0
    line = out.splitlines()[0]
    assert line.startswith(f"VLLM_SERVER_DEV_MODE=1 VLLM_API_KEY=$EXGRPO_ROLLOUT_API_KEY {sys.executable} -m "
                           "vllm.entrypoints.openai.api_server ")
    assert "s3cret-rollout-key-16" not in out  # the key goes by environment, never on the command line
    args = shlex.split(line.split(" ", 2)[2])
    assert args[:5] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", "Qwen/Qwen2.5-Math-7B"]
    rest = args[5:]  # flag-value pairs, and the one switch
    assert "--enable-scale-out" in rest
    rest.remove("--enable-scale-out")
    flags = dict(zip(rest[::2], rest[1::2]))
    assert flags == {"--host": "10.0.0.5", "--port": "8000", "--dtype": "bfloat16", "--seed": "0",
                     "--tensor-parallel-size": "2", "--data-parallel-size": "4", "--gpu-memory-utilization": "0.9",
                     "--logprobs-mode": "processed_logprobs", "--generation-config": "vllm",
                     "--weight-transfer-config": '{"backend": "nccl"}', "--max-model-len": "9216",
                     "--max-num-seqs": "512",
                     "--worker-extension-cls": "exgrpo_core.rollout.vllm_engine.WeightSyncExtension"}
    assert json.loads(flags["--weight-transfer-config"]) == {"backend": "nccl"}
    assert "worker_extension_cls" in CONTRACT["classes"]["EngineArgs"]["fields"]  # vllm serve has the flag
    assert "rollout.server_url=http://10.0.0.5:8000" in out


def test_without_vllm_it_is_one_clear_line(capsys):
    code = main(["rollout-server", "--model", "m"])  # this interpreter has no vLLM (the tests' main environment)
    out = capsys.readouterr().out
    assert code == 2
    errors = [line for line in out.splitlines() if line.startswith("error")]
    assert errors == [f"error: `exgrpo rollout-server` runs vLLM's server, which {sys.executable} cannot import: "
                      "`pip install exgrpo[vllm]` on the rollout node (or --python an interpreter that has vLLM)"]


def test_the_cpu_build_serves_with_the_gloo_transfer(capsys):
    assert main(["rollout-server", "--model", "m", "--python", "/opt/vllm-cpu/bin/python", "--weight-transfer",
                 "gloo", "--dry-run"]) == 0
    out = capsys.readouterr().out
    args = shlex.split(out.splitlines()[0].split(" ", 1)[1])
    assert args[0] == "/opt/vllm-cpu/bin/python"
    assert json.loads(args[args.index("--weight-transfer-config") + 1]) == {"backend": "gloo"}
    assert "--set rollout.weight_transfer=gloo" in out


@pytest.mark.parametrize("passed", [["--host", "0.0.0.0"], ["--host=0.0.0.0"], ["--port", "9000"], ["--port=9000"],
                                    ["--max-num-seqs", "8", "--hos", "0.0.0.0"], ["--uds", "/tmp/open.sock"]])
@pytest.mark.parametrize("dry_run", [True, False])
def test_host_or_port_passed_through_to_vllm_is_refused(capsys, monkeypatch, passed, dry_run):
    """vLLM keeps the last --host (and --uds wins over both): one after `--` would undo the gate's private socket."""
    monkeypatch.setenv("EXGRPO_ROLLOUT_API_KEY", "s3cret-rollout-key-16")
    from flows import rollout_gate

    started = []
    monkeypatch.setattr(cli_tools, "has_vllm", lambda python: started.append(python) or True)
    monkeypatch.setattr(rollout_gate, "serve", lambda *a: started.append("serve") or 0)
    code = main(["rollout-server", "--model", "m", "--host", "10.0.0.5", *(["--dry-run"] if dry_run else []),
                 "--", *passed])
    out = capsys.readouterr().out
    assert code == 2 and started == []  # nothing printed to run, nothing started
    flag = next(a for a in passed if a.startswith(("--ho", "--po", "--ud")))
    assert out.splitlines() == [f"error: {flag} after `--` would override where vLLM listens (and the key gate's "
                                "private socket): use exgrpo rollout-server's own --host / --port"]


@pytest.mark.parametrize("key", ["1", "fifteen-chars-x"])
def test_a_short_key_is_refused_in_one_line(capsys, monkeypatch, key):
    from flows import rollout_gate

    monkeypatch.setenv("EXGRPO_ROLLOUT_API_KEY", key)
    assert main(["rollout-server", "--model", "m", "--host", "0.0.0.0", "--dry-run"]) == 2
    out = capsys.readouterr().out
    assert out.splitlines() == [f"error: EXGRPO_ROLLOUT_API_KEY has {len(key)} characters: use at least 16 (e.g. "
                                "`python -c 'import secrets; print(secrets.token_urlsafe(24))'`)"]
    with pytest.raises(ValueError, match="at least 16"):
        rollout_gate.TokenGate("127.0.0.1", 0, 1, key)
    rollout_gate.TokenGate("127.0.0.1", 0, 1, key.ljust(16, "x")).server_close()  # 16 and more are taken
