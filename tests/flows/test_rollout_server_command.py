"""`exgrpo rollout-server` is a thin wrapper over `vllm serve`: the command it prints (and runs) has the flags
rollout.engine=remote needs, and without vLLM it stops with one line naming the install.

Run: .venv/bin/python -m pytest tests/flows/test_rollout_server_command.py -q
"""

from __future__ import annotations

import json
import shlex
import shutil

from flows.cli import main


def test_dry_run_prints_the_vllm_serve_command(capsys, monkeypatch):
    monkeypatch.setenv("EXGRPO_ROLLOUT_API_KEY", "s3cret")
    code = main(["rollout-server", "--model", "Qwen/Qwen2.5-Math-7B", "--host", "10.0.0.5", "--port", "8000",
                 "--tensor-parallel-size", "2", "--data-parallel-size", "4", "--max-model-len", "9216", "--dry-run",
                 "--", "--max-num-seqs", "512"])
    out = capsys.readouterr().out
    assert code == 0
    line = out.splitlines()[0]
    assert line.startswith("VLLM_SERVER_DEV_MODE=1 VLLM_API_KEY=$EXGRPO_ROLLOUT_API_KEY vllm serve ")
    assert "s3cret" not in out  # the key goes by environment, never on the command line
    args = shlex.split(line.split(" ", 2)[2])
    assert args[:3] == ["vllm", "serve", "Qwen/Qwen2.5-Math-7B"]
    rest = args[3:]  # flag-value pairs, and the one switch
    assert "--enable-scale-out" in rest
    rest.remove("--enable-scale-out")
    flags = dict(zip(rest[::2], rest[1::2]))
    assert flags == {"--host": "10.0.0.5", "--port": "8000", "--dtype": "bfloat16", "--seed": "0",
                     "--tensor-parallel-size": "2", "--data-parallel-size": "4", "--gpu-memory-utilization": "0.9",
                     "--logprobs-mode": "processed_logprobs", "--generation-config": "vllm",
                     "--weight-transfer-config": '{"backend": "nccl"}', "--max-model-len": "9216",
                     "--max-num-seqs": "512"}
    assert json.loads(flags["--weight-transfer-config"]) == {"backend": "nccl"}
    assert "rollout.server_url=http://10.0.0.5:8000" in out


def test_without_vllm_it_is_one_clear_line(capsys, monkeypatch):
    real = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "vllm" else real(name, *a, **k))
    code = main(["rollout-server", "--model", "m"])
    out = capsys.readouterr().out
    assert code == 2
    errors = [line for line in out.splitlines() if line.startswith("error")]
    assert errors == ["error: `exgrpo rollout-server` runs `vllm serve`, which is not installed here: "
                      "`pip install exgrpo[vllm]` on the rollout node"]
