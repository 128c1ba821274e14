#!/usr/bin/env bash
# Install TRL (and py-spy for profiling) into benchmarks/.trl for the speed benchmark only:
# they are not project dependencies. TRL's own requirements (accelerate, datasets, transformers,
# pandas, pyarrow, ...) are already in .venv; trl 1.16.0 accepts transformers 5.x.
#   bash benchmarks/speed/setup_trl.sh        then   .venv/bin/python benchmarks/speed/trl_speed.py
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
TRL_VERSION=${TRL_VERSION:-1.16.0}
"$PY" -m pip install --quiet --no-deps --target benchmarks/.trl "trl==${TRL_VERSION}" "py-spy==0.4.3"
"$PY" - <<'PY'
import sys
sys.path.insert(0, "benchmarks/.trl")
import trl
from trl import GRPOConfig, GRPOTrainer  # noqa: F401  fails here if TRL and transformers disagree
print(f"trl {trl.__version__} ready in benchmarks/.trl")
PY
