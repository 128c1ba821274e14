"""infra/services.sh up fails loudly, and leaves nothing half-started, when a service cannot start."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _sh(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "infra" / "services.sh"), *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=420)


def test_up_fails_with_the_address_when_postgres_is_unreachable(tmp_path):
    env = {**os.environ, "EXGRPO_STATE_DIR": str(tmp_path), "EXGRPO_PG_HOST": "127.0.0.2", "EXGRPO_PG_PORT": "1"}
    out = _sh(env, "up")
    assert out.returncode == 1 and "no server accepting connections at 127.0.0.2:1" in out.stderr
    assert not list(tmp_path.glob("*.pid"))


@pytest.mark.slow
@pytest.mark.postgres
def test_a_server_that_cannot_bind_fails_up_and_the_other_is_stopped(tmp_path):
    blocker = socket.socket()  # holds MLflow's port: the server exits at start
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    prefect_port = free.getsockname()[1]
    free.close()
    env = {**os.environ, "EXGRPO_STATE_DIR": str(tmp_path), "EXGRPO_DB_PREFIX": f"ftest_{secrets.token_hex(4)}",
           "EXGRPO_MLFLOW_PORT": str(blocker.getsockname()[1]), "EXGRPO_PREFECT_PORT": str(prefect_port),
           "EXGRPO_PYTHON": sys.executable}
    try:
        out = _sh(env, "up")
        assert out.returncode != 0
        assert "mlflow: exited during start; last lines of" in out.stderr, out.stderr
        status = _sh(env, "status")
        assert status.returncode == 1
        assert [line.split()[:2] for line in status.stdout.splitlines()[1:]] == [
            ["mlflow", "down"], ["prefect", "down"], ["worker", "down"]]
        assert not list(tmp_path.glob("*.pid"))
    finally:
        blocker.close()
        _sh(env, "down")
        drop = _sh(env, "drop", "--yes")
        assert drop.returncode == 0, drop.stderr
