#!/usr/bin/env bash
# The prepared GPU check (issues 31 and 32): at most 8 minutes on one H100. Each section is a Python
# module in benchmarks/gpu/ that writes its JSON file as it goes (device, torch, commit in each):
#   decode.json, agreement.json  (a, b) every rollout.decoder path: ms/step, tokens/s at 256 rows, profile,
#                                greedy agreement and log-prob gap against the eager model
#   train_step.json              (c) training-step MFU / HFU before and after each change
#   fsdp_check.json              (d) FSDP2 holds no unsharded fp32 accumulator; memory vs memory_plan
#   cuda_tests.json              (e) pytest -m gpu
#   summary.json                 exit code and seconds of each section
# Output: $OUT if set, else benchmarks/results/gpu/ (--tiny: $TMPDIR/gpu_check_tiny). `--tiny` (automatic without
# CUDA): tiny shapes on CPU.
# A section that fails or runs past its limit is recorded and the next one runs.
#   bash benchmarks/gpu_check.sh            (GPU; on the lent machine first `bash benchmarks/gpu/wheels.sh` here,
#                                            then carry .whl and set GPU_CHECK_COMMIT: docs/benchmarks/gpu.md)
#   bash benchmarks/gpu_check.sh --tiny     (CPU rehearsal; tests/benchmarks/test_gpu_check.py runs it)
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
# On the lent machine: the wheels its image lacks, made here by benchmarks/gpu/wheels.sh and carried as .whl
if ls .whl/*.whl >/dev/null 2>&1 && [ ! -x .venv/bin/python ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu_check_site .whl/*.whl \
    && export PYTHONPATH=/tmp/gpu_check_site:$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
export GPU_CHECK_COMMIT=${GPU_CHECK_COMMIT:-$(git rev-parse HEAD 2>/dev/null || cat .commit 2>/dev/null || echo unknown)}
TINY=()
SLACK=1
# --tiny: a CPU rehearsal, where a shared machine may be slow: three times the limits
[ "${1:-}" = "--tiny" ] && TINY=(--tiny) && SLACK=3
[ ${#TINY[@]} -eq 0 ] && ! "$PY" -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null \
  && TINY=(--tiny) && SLACK=3 && echo "no CUDA GPU: --tiny"
# (a rehearsal never writes over the committed GPU results)
OUTDIR=${OUT:-$([ ${#TINY[@]} -gt 0 ] && echo "${TMPDIR:-/tmp}/gpu_check_tiny" || echo benchmarks/results/gpu)}
mkdir -p "$OUTDIR"
start=$(date +%s)
summary="{"
# section module, seconds allowed (the sum stays under 8 minutes; H200 2026-11-27: decode needed over 160 s
# with the static path's compile, train 58 s, FSDP2 33 s, the CUDA tests 77 s and then over 88 s).
# GPU_CHECK_SECTIONS picks and orders them, e.g. "cuda_tests decode" (default: all, tests first).
declare -A LIMIT=([cuda_tests]=150 [decode]=220 [train_step]=75 [fsdp_check]=45)
for name in ${GPU_CHECK_SECTIONS:-cuda_tests decode train_step fsdp_check}; do
  [ -n "${LIMIT[$name]:-}" ] || { echo "gpu_check: no section '$name' (sections: ${!LIMIT[*]})" >&2; exit 2; }
  set -- "$name" "${LIMIT[$name]}"
  export GPU_SECTION_LIMIT=$(( $2 * SLACK ))
  t0=$(date +%s)
  echo "== $1 (limit $(( $2 * SLACK )) s)"
  timeout --kill-after=5 "$(( $2 * SLACK ))" "$PY" "benchmarks/gpu/$1.py" --out "$OUTDIR" "${TINY[@]}"
  rc=$?
  summary="$summary\"$1\": {\"returncode\": $rc, \"seconds\": $(( $(date +%s) - t0 ))}, "
done
summary="$summary\"total_seconds\": $(( $(date +%s) - start )), \"commit\": \"$GPU_CHECK_COMMIT\"}"
echo "$summary" > "$OUTDIR/summary.json"
echo "$summary"
