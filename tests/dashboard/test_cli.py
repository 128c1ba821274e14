"""`exgrpo dashboard` argument handling, in a subprocess (Prefect's log handlers and capsys do not mix)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_malformed_database_url_is_one_clear_error():
    out = subprocess.run([sys.executable, "-m", "flows.cli", "dashboard", "--db-url", "mysql://root@localhost/x",
                          "--port", "1"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "unknown database dialect" in out.stdout and "Traceback" not in out.stdout + out.stderr


def test_help_lists_the_training_settings_it_shares():
    out = subprocess.run([sys.executable, "-m", "flows.cli", "dashboard", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0
    for flag in ("--config", "--set", "--db-url", "--mlflow-uri", "--port", "--host"):
        assert flag in out.stdout


def test_it_resolves_the_database_and_mlflow_store_as_training_does(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("EXGRPO_DB_URL", "MLFLOW_TRACKING_URI")}
    env["COLUMNS"] = "500"  # one line of output, unwrapped
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "dashboard", "--config", "tiny", "--set",
                             f"run.output_dir={tmp_path}", "--port", "1"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    try:
        first = proc.stdout.readline()
    finally:
        proc.kill()
        proc.wait()
    assert f"database sqlite:///{tmp_path}/tiny/experience.db" in first, first
    assert f"MLflow sqlite:///{tmp_path}/mlflow.db" in first, first
