"""Long steps a newcomer waits through say one line each. scripts/setup.sh: one line per step, pip's output
(setuptools' editable-install warning box) in .venv/setup.log, shown only when a step fails, which then
exits non-zero (a stand-in .venv/bin/python plays pip in a copy of the script's folder). The first use of
SmolLM2 (cpu-demo): one line before its GGUF conversion."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BOX = "Please be careful with folders in your working directory"
FAKE_PYTHON = f"""#!/usr/bin/env bash
echo "pip $*" >> "$(dirname "$0")/../calls"
if [[ "$*" == *" -e "* ]]; then
  echo "********************************************************************************" >&2
  echo "{BOX} with the same name as your package" >&2
  [ -n "${{FAIL_EDITABLE:-}}" ] && {{ echo "ERROR: editable install broke" >&2; exit 1; }}
fi
exit 0
"""


def _setup(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    return subprocess.run(["bash", "scripts/setup.sh"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})


def test_setup_prints_one_line_a_step_and_keeps_pips_output_in_a_log(tmp_path):
    out = _setup(tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert BOX not in out.stdout + out.stderr and out.stderr == ""
    lines = out.stdout.splitlines()
    assert all(line.startswith("[setup] ") for line in lines) and len(lines) == 6, lines
    assert "installing the project and its dependencies (editable)" in out.stdout
    assert BOX in (tmp_path / ".venv" / "setup.log").read_text()
    assert len((tmp_path / ".venv" / "calls").read_text().splitlines()) == 4
    again = _setup_again(tmp_path)
    assert again.returncode == 0 and again.stdout == ""  # done already: silent


def _setup_again(tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "scripts/setup.sh"], cwd=tmp_path, capture_output=True, text=True, timeout=60)


def test_a_failed_install_shows_its_output_and_exits_non_zero(tmp_path):
    out = _setup(tmp_path, FAIL_EDITABLE="1")
    assert out.returncode != 0
    assert "[setup] failed: installing the project and its dependencies (editable)" in out.stderr
    assert "ERROR: editable install broke" in out.stderr and BOX in out.stderr
    assert not (tmp_path / ".venv" / ".exgrpo-setup").exists()  # the next setup tries again


def test_the_smollm2_conversion_says_one_line_first(tmp_path, monkeypatch, capsys):
    from exgrpo_core.models import load

    class Stop(Exception):
        pass

    def stop(*args, **kwargs):
        raise Stop

    monkeypatch.setattr(load, "smollm2_gguf_path", lambda: tmp_path / load.SMOLLM2_GGUF)
    monkeypatch.setattr(load.AutoTokenizer, "from_pretrained", stop)  # the conversion itself is not needed
    try:
        load.convert_smollm2(tmp_path / "smol")
    except Stop:
        pass
    out = capsys.readouterr()
    assert out.out == (f"converting smollm2-135m-instruct from {load.SMOLLM2_GGUF} into {tmp_path / 'smol'} "
                       "(first use only, about a minute)\n") and out.err == ""
