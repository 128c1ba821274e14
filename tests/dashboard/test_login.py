"""The dashboard's login: `exgrpo dashboard` refuses an address beyond loopback without EXGRPO_DASHBOARD_LOGIN
(one line); with it, the real dashboard process answers a stranger 401 (pages and the page's WebSocket), and a
user with the password gets the page, drawn in headless chromium. MLflow is read with the read-only login."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import websocket  # websocket-client

from flows import dashboard_gate
from tests.dashboard.test_browser import _screenshots_module

ROOT = Path(__file__).resolve().parents[2]
LOGIN = "alice:correct-horse-battery"


def _run(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flows.cli", "dashboard", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**env, "COLUMNS": "300"})


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "::"])
def test_an_address_beyond_loopback_needs_a_login(host):
    env = {k: v for k, v in os.environ.items() if k != dashboard_gate.LOGIN_ENV}
    out = _run(["--host", host, "--port", "1"], env)
    assert out.returncode == 2 and out.stdout.splitlines() == [
        f"error: --host {host} would serve the runs to anyone who reaches it: set EXGRPO_DASHBOARD_LOGIN="
        "user:password (docs/dashboard.md, Login)"], out.stdout + out.stderr


@pytest.mark.parametrize("login, line", [("alice", "EXGRPO_DASHBOARD_LOGIN must be user:password"),
                                         ("alice:short", "EXGRPO_DASHBOARD_LOGIN's password has 5 characters: use "
                                                         "at least 12")])
def test_a_malformed_login_is_one_line(login, line):
    out = _run(["--port", "1"], {**os.environ, dashboard_gate.LOGIN_ENV: login})
    assert out.returncode == 2 and out.stdout.splitlines() == [f"error: {line}"], out.stdout + out.stderr


def test_mlflow_is_read_with_the_read_only_login_never_the_admins():
    admin = {"MLFLOW_TRACKING_USERNAME": "admin", "MLFLOW_TRACKING_PASSWORD": "admin-secret", "PATH": "/bin"}
    env, note = dashboard_gate.mlflow_env({**admin, "EXGRPO_MLFLOW_READER_PASSWORD": "reader-secret"})
    assert (env["MLFLOW_TRACKING_USERNAME"], env["MLFLOW_TRACKING_PASSWORD"]) == ("exgrpo_reader", "reader-secret")
    assert note == " (read-only login exgrpo_reader)" and env["PATH"] == "/bin"
    env, note = dashboard_gate.mlflow_env(admin)
    assert "admin-secret" not in env.values() and "MLFLOW_TRACKING_USERNAME" not in env
    assert "EXGRPO_MLFLOW_READER_PASSWORD is not set" in note


def _get(url: str, auth: str | None = None) -> tuple[int, dict, str]:
    req = urllib.request.Request(url)
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode(errors="replace")


def _ws(port: int, auth: str | None) -> str:
    """The WebSocket handshake's outcome on Streamlit's stream route."""
    headers = [f"Authorization: Basic {base64.b64encode(auth.encode()).decode()}"] if auth else []
    try:
        ws = websocket.create_connection(f"ws://127.0.0.1:{port}/_stcore/stream", header=headers, timeout=20,
                                         subprotocols=["streamlit"])
    except websocket.WebSocketBadStatusException as e:
        return f"refused {e.status_code}"
    ws.close()
    return "open"


@pytest.fixture
def gated_dashboard(tmp_path):
    shots = _screenshots_module()
    port = shots.free_port()
    log = open(tmp_path / "dashboard.log", "w")
    env = {**os.environ, dashboard_gate.LOGIN_ENV: LOGIN, "MLFLOW_TRACKING_USERNAME": "admin",
           "MLFLOW_TRACKING_PASSWORD": "admin-secret", "EXGRPO_MLFLOW_READER_PASSWORD": "reader-secret"}
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "dashboard", "--db-url",
                             f"sqlite:///{tmp_path / 'exp.db'}", "--mlflow-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
                             "--host", "0.0.0.0", "--port", str(port)], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    while _get_quiet(f"http://127.0.0.1:{port}/_stcore/health") != 200:  # the probe needs no login
        assert proc.poll() is None and time.time() < deadline, (tmp_path / "dashboard.log").read_text()[-2000:]
        time.sleep(0.5)
    yield port, proc.pid
    shots.stop(proc)
    assert "Traceback" not in (tmp_path / "dashboard.log").read_text()


def _get_quiet(url: str) -> int | None:
    try:
        return _get(url)[0]
    except OSError:
        return None


def _children_environ(pid: int) -> list[bytes]:
    out = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and (p / "stat").read_text().rsplit(")", 1)[1].split()[1] == str(pid):
                out.append((p / "environ").read_bytes())
        except OSError:
            pass
    return out


def test_a_stranger_gets_401_and_the_user_gets_the_page(gated_dashboard):
    port, pid = gated_dashboard
    (streamlit,) = _children_environ(pid)  # Streamlit behind the gate: the reader's MLflow login, not the admin's
    assert b"MLFLOW_TRACKING_PASSWORD=reader-secret\0" in streamlit and b"admin-secret" not in streamlit
    assert b"EXGRPO_DASHBOARD_LOGIN" not in streamlit
    base = f"http://127.0.0.1:{port}"
    for who in (None, "alice:wrong-password-x", "mallory:correct-horse-battery", "alice:correct-horse-batter"):
        status, headers, body = _get(base + "/", who)
        assert status == 401 and headers["WWW-Authenticate"].startswith('Basic realm="exgrpo dashboard"'), who
        assert "streamlit" not in body.lower()
        assert _get(base + "/_stcore/host-config", who)[0] == 401
        assert _ws(port, who) == "refused 401"
    status, _, body = _get(base + "/", LOGIN)
    assert status == 200 and "streamlit" in body.lower()
    assert _ws(port, LOGIN) == "open"


def test_the_page_draws_in_chromium_with_the_login_only(gated_dashboard):
    shots = _screenshots_module()
    base = f"http://127.0.0.1:{gated_dashboard[0]}"
    driver = shots.chromium()
    try:
        driver.get(base + "/")
        time.sleep(3)
        stranger = shots.page_text(driver)
        driver.execute_cdp_cmd("Network.enable", {})
        token = base64.b64encode(LOGIN.encode()).decode()
        driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {"Authorization": f"Basic {token}"}})
        driver.get(base + "/")
        deadline, text = time.time() + 90, ""
        while time.time() < deadline and "no experience database at" not in text:
            time.sleep(1)
            text = shots.page_text(driver)
    finally:
        driver.quit()
    assert "Runs" not in stranger and "experience database" not in stranger  # the login prompt, or the 401
    assert "no experience database at" in text, text[:2000]  # the app ran: its page, over the gated WebSocket
