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


def _first_line(args: list[str], env: dict) -> str:
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "dashboard", *args, "--port", "1"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**env, "COLUMNS": "40"})
    try:
        return proc.stdout.readline()
    finally:
        proc.kill()
        proc.wait()


def test_it_prefers_the_read_only_role_that_services_env_exports(tmp_path):
    """`eval "$(infra/services.sh env)"` exports the training role's EXGRPO_DB_URL and the read-only
    EXGRPO_DASHBOARD_DB_URL: the dashboard takes the read-only one and says so in its first line."""
    rw = "postgresql+psycopg://exgrpo_train@127.0.0.1:9/exp"
    ro = "postgresql+psycopg://exgrpo_dashboard@127.0.0.1:9/exp"
    base = {k: v for k, v in os.environ.items() if k not in ("EXGRPO_DB_URL", "EXGRPO_DASHBOARD_DB_URL")}
    first = _first_line([], {**base, "EXGRPO_DB_URL": rw, "EXGRPO_DASHBOARD_DB_URL": ro})
    assert f"database {ro} (read-only role, EXGRPO_DASHBOARD_DB_URL)" in first, first
    first = _first_line([], {**base, "EXGRPO_DB_URL": rw})  # only the training role: used, and said so
    assert f"database {rw} (training role, EXGRPO_DB_URL; EXGRPO_DASHBOARD_DB_URL is not set)" in first, first
    first = _first_line(["--db-url", f"sqlite:///{tmp_path}/x.db"], {**base, "EXGRPO_DASHBOARD_DB_URL": ro})
    assert f"database sqlite:///{tmp_path}/x.db (--db-url)" in first, first
    first = _first_line(["--config", "tiny", "--set", f"run.db_url=sqlite:///{tmp_path}/y.db"],
                        {**base, "EXGRPO_DASHBOARD_DB_URL": ro})  # the config names its own database
    assert f"database sqlite:///{tmp_path}/y.db (run.db_url of the config)" in first, first
