"""`exgrpo train` against a Prefect server with logins (PREFECT_SERVER_API_AUTH_STRING) and no or a wrong
PREFECT_API_AUTH_STRING: one line saying so, exit 2, no traceback (as MLflow's missing login is). The server
here answers as Prefect's auth middleware does: /health for anyone, every other route 401 without the
right Basic credentials."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
AUTH = "exgrpo:right-secret"


class _PrefectWithLogins(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        ok = self.path.endswith("/health") or self.headers.get("Authorization") == (
            "Basic " + base64.b64encode(AUTH.encode()).decode())
        body = b'"3.0.0"' if ok else b'{"exception_message": "Unauthorized"}'
        self.send_response(200 if ok else 401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PATCH = _answer

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _PrefectWithLogins)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/api"
    srv.shutdown()


@pytest.mark.parametrize("auth, named", [(None, "asks for a login: set PREFECT_API_AUTH_STRING"),
                                         ("exgrpo:s3cr3t-guess", "refused PREFECT_API_AUTH_STRING")])
def test_a_missing_or_wrong_prefect_login_is_one_line(server, tmp_path, auth, named):
    args = [sys.executable, "-m", "flows.cli", "train", "--config", "tiny"]
    for s in (f"run.output_dir={tmp_path / 'runs'}", f"run.db_url=sqlite:///{tmp_path / 'exp.db'}", "run.steps=1",
              "run.name=login", f"run.mlflow_tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}"):
        args += ["--set", s]
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_AUTH_STRING"}
    env.update(PREFECT_API_URL=server, PREFECT_HOME=str(tmp_path / "ph"), **({"PREFECT_API_AUTH_STRING": auth}
                                                                            if auth else {}))
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    out = proc.stdout + proc.stderr
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in out, out[-3000:]
    assert named in errors[0] and server in errors[0], errors
    assert "s3cr3t" not in out and "right-secret" not in out  # no credentials printed
    assert not (tmp_path / "runs" / "login").exists()
