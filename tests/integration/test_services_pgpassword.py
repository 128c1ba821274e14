"""The admin's PGPASSWORD (set as infra/README.md says) never reaches a process that logs in as a service
role: libpq prefers it to the pass file, so `infra/services.sh db` failed with it set (issue 35, item 7)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _bash(script: str, tmp_path: Path) -> str:
    env = {**os.environ, "PGPASSWORD": "admin-secret", "EXGRPO_STATE_DIR": str(tmp_path),
           "EXGRPO_PGPASSFILE": str(tmp_path / "pgpass")}
    (tmp_path / "pgpass").write_text("127.0.0.1:5432:*:exgrpo_train:train-secret\n")
    out = subprocess.run(["bash", "-c", f"source infra/config.sh; source infra/postgres.sh; {script}"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_migration_runs_without_the_admin_password_and_with_the_pass_file(tmp_path):
    seen = _bash("_pg_env env", tmp_path)
    assert "PGPASSWORD=" not in seen and f"PGPASSFILE={tmp_path / 'pgpass'}" in seen
    (tmp_path / "pgpass").unlink()
    assert "PGPASSWORD=" not in _bash("rm -f $EXGRPO_PGPASSFILE; _pg_env env", tmp_path)


def test_services_and_the_users_exports_drop_the_admin_password(tmp_path):
    env = {**os.environ, "PGPASSWORD": "admin-secret", "EXGRPO_STATE_DIR": str(tmp_path),
           "EXGRPO_PGPASSFILE": str(tmp_path / "pgpass")}
    (tmp_path / "pgpass").write_text("127.0.0.1:5432:*:exgrpo_train:train-secret\n")
    served = subprocess.run(["bash", "-c", "source infra/services.sh env >/dev/null; service_env; \"${ENV[@]}\" env"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert served.returncode == 0 and "PGPASSWORD=" not in served.stdout, served.stderr
    exports = subprocess.run(["bash", "infra/services.sh", "env"], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=60).stdout
    assert "unset PGPASSWORD" in exports
