"""Shared fixtures: tiny configs in a temp folder, and one real Prefect server per test session.

The Prefect server takes 20-30 s to start on 2 cores, so it starts once (lazily, only when a test
asks for it) and every flow run in the session, in-process or in a subprocess, talks to it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# tests/vllm_real run in the environment that has a real vLLM (.venv-vllm; scripts/test.sh runs both)
collect_ignore = [] if importlib.util.find_spec("vllm") else ["vllm_real"]
os.environ.setdefault("EXGRPO_CACHE", str(Path(tempfile.gettempdir()) / "exgrpo-test-cache"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def prefect_server():
    """URL of a Prefect API server started for this test session (fails if it cannot start)."""
    home = Path(tempfile.mkdtemp(prefix="exgrpo-prefect-"))
    port = _free_port()
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_UI_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    log = open(home / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                             "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/api"
    deadline = time.time() + 180
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"Prefect server exited early: {(home / 'server.log').read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            time.sleep(1)
    else:
        proc.kill()
        raise RuntimeError("Prefect server did not become healthy within 180 s")
    old = os.environ.get("PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = url
    with _prefect_settings(url):
        yield url
    if old is None:
        os.environ.pop("PREFECT_API_URL", None)
    else:
        os.environ["PREFECT_API_URL"] = old
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()
    shutil.rmtree(home, ignore_errors=True)


@contextlib.contextmanager
def _prefect_settings(url: str):
    """Prefect reads PREFECT_API_URL when first imported, which in a full session is at collection,
    before this fixture sets it: override the settings too, so in-process clients and flows use it."""
    if "prefect" not in sys.modules:
        yield
        return
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: url}):
        yield


@pytest.fixture
def tiny_overrides(tmp_path):
    """Overrides that put a tiny run's files (SQLite, MLflow, checkpoints) under tmp_path."""
    return [f"run.output_dir={tmp_path / 'runs'}", f"run.db_url=sqlite:///{tmp_path / 'exp.db'}",
            f"run.mlflow_tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}"]


@pytest.fixture(autouse=True)
def no_active_mlflow_run_left_behind():
    """A test whose flow fails in-process may leave MLflow's fluent run active; end it so the next
    test's `start_run` does not fail with "Run ... is already active"."""
    yield
    mlflow = sys.modules.get("mlflow")
    if mlflow is not None:
        while mlflow.active_run() is not None:
            mlflow.end_run("FAILED")


_SECRET_VARS = ("EXGRPO_", "MLFLOW_TRACKING_")


@pytest.fixture(autouse=True)
def no_secret_variables_left_behind():
    """`hide_overrides` moves credentials into this process's environment (for the children it starts);
    a test that calls it must not hand them to the next test, which would connect to that database."""
    before = {k: v for k, v in os.environ.items() if k.startswith(_SECRET_VARS)}
    yield
    for k in [k for k in os.environ if k.startswith(_SECRET_VARS) and k not in before]:
        del os.environ[k]
    os.environ.update(before)
