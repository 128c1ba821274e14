"""EXGRPO_DASHBOARD_URL is the dashboard's web address (the run summary's link) and EXGRPO_DASHBOARD_DB_URL
its database: the infra scripts must not overwrite the one with the other."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WEB = "https://dash.example.org:8501"
PRINT_LINK = "from flows.run_report import dashboard_url; print(dashboard_url('r1'))"


def _env(tmp_path: Path, **extra) -> dict:
    return {**os.environ, "EXGRPO_STATE_DIR": str(tmp_path), "EXGRPO_DASHBOARD_URL": WEB,
            "EXGRPO_DASHBOARD_DB_URL": "postgresql+psycopg://someone@db:5432/old", **extra}


def test_a_flow_run_started_by_the_worker_links_the_dashboard_web_address(tmp_path):
    fake = tmp_path / "python"  # stands in for the worker: prints the link a flow run's summary would carry
    fake.write_text(f"#!/bin/sh\nexec {sys.executable} -c \"{PRINT_LINK}\"\n")
    fake.chmod(0o755)
    out = subprocess.run(["bash", "-c", 'source infra/services.sh env >/dev/null; worker_cmd; "${CMD[@]}"'],
                         cwd=ROOT, env=_env(tmp_path, EXGRPO_PYTHON=str(fake)),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"{WEB}/?run=r1", out.stdout


def test_the_exports_name_the_database_and_leave_the_web_address(tmp_path):
    script = ('eval "$(bash infra/services.sh env)"; echo "db=$EXGRPO_DASHBOARD_DB_URL"; '
              f'{sys.executable} -c "{PRINT_LINK}"')
    out = subprocess.run(["bash", "-c", script], cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "db=postgresql+psycopg://exgrpo_dashboard@127.0.0.1:5432/exgrpo_experience", lines
    assert lines[1] == f"{WEB}/?run=r1" and lines[1].startswith("https://"), lines
