#!/usr/bin/env bash
# Wheels the lent GPU machine's image lacks (it has torch, transformers, accelerate, numpy, scipy, pytest,
# ...; no network): the project's imports on the gpu_check path, for Python 3.12 on x86-64, into .whl/.
# gpu_check.sh installs them from there when the folder exists. Run here, then carry .whl:
#   bash benchmarks/gpu/wheels.sh     (versions: those of this checkout's .venv where installed)
set -eu
cd "$(dirname "$0")/../.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo /.whl/ >> .git/info/exclude; }
PY=${PYTHON:-.venv/bin/python}
names="pydantic pydantic_core annotated-types typing-inspection typing_extensions SQLAlchemy greenlet alembic Mako
math-verify latex2sympy2_extended antlr4-python3-runtime"
pins=()
for n in $names; do
  v=$("$PY" -m pip show "$n" 2>/dev/null | sed -n 's/^Version: //p')
  pins+=("$n${v:+==$v}")
done
plats=()
for p in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do plats+=(--platform "${p}_x86_64"); done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plats[@]}" -d .whl "${pins[@]}"
ls .whl
