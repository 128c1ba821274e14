"""Prefect's API for one `exgrpo` command when PREFECT_API_URL is unset: a local server that dies with it.

Prefect's own ephemeral server (a `uvicorn` child started on the first API call) outlives a SIGKILLed
trainer (issue 16, item 6). `serve_prefect_api` starts the same server (Prefect's app, the same
ephemeral settings, on 127.0.0.1) in a process that watches the command (`exgrpo_core.run.lifeline`: a
watchdog thread, plus PR_SET_PDEATHSIG when started from the main thread), points Prefect at it for the
command's life and stops it at exit. With PREFECT_API_URL set, nothing is started.

    python -m flows.prefect_api PORT PARENT_PID KERNEL   # the server process (serve_prefect_api starts it)
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request

_KEEP = contextlib.ExitStack()  # settings entered for the process's life
TIMEOUT_ENV = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
_SERVER_ENV = {"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}


class PrefectStartError(RuntimeError):
    """Prefect's ephemeral API did not come up; the message says how to fix it."""


def serve_prefect_api() -> str | None:
    """Unless PREFECT_API_URL is set, start a Prefect API of this process's own and point Prefect at it
    for the rest of the process; it is stopped at exit, after Prefect's own exit handlers (registered
    later, run earlier) have flushed their logs and events to it. Returns its URL (None: not started)."""
    if os.environ.get("PREFECT_API_URL"):
        check_login(os.environ["PREFECT_API_URL"])
        return None
    proc, url = _start(float(os.environ.get(TIMEOUT_ENV, "20")))
    atexit.register(_stop, proc)
    os.environ["PREFECT_API_URL"] = url
    if "prefect" in sys.modules:  # Prefect read its settings at import: override them for good
        from prefect.settings import PREFECT_API_URL, temporary_settings

        _KEEP.enter_context(temporary_settings(updates={PREFECT_API_URL: url}))
    return url


def check_login(url: str, timeout_s: float = 10.0) -> None:
    """A server with logins (PREFECT_SERVER_API_AUTH_STRING) must take PREFECT_API_AUTH_STRING: one line when
    it is missing or wrong, before Prefect's client fails on it with a traceback. A server that does not
    answer is left to Prefect's client."""
    import base64
    import urllib.error

    from prefect.settings import get_current_settings  # the variable, or a Prefect profile's setting

    secret = get_current_settings().api.auth_string
    auth = secret.get_secret_value() if secret else None
    req = urllib.request.Request(url.rstrip("/") + "/admin/version")
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        urllib.request.urlopen(req, timeout=timeout_s).close()
    except urllib.error.HTTPError as e:
        if e.code == 401:
            raise PrefectStartError(f"Prefect server at {url} " + (
                "refused PREFECT_API_AUTH_STRING: check its user:password" if auth else
                "asks for a login: set PREFECT_API_AUTH_STRING=user:password (infra/README.md, Logins)")) from None
    except (urllib.error.URLError, OSError, ValueError):
        return


def _start(timeout_s: float) -> tuple[subprocess.Popen, str]:
    kernel = threading.current_thread() is threading.main_thread()
    deadline = time.monotonic() + timeout_s
    for _ in range(3):  # a port taken between choosing and binding: the server exits, try another
        port = _free_port()
        proc = subprocess.Popen([sys.executable, "-m", "flows.prefect_api", str(port), str(os.getpid()),
                                 "1" if kernel else "0"], env={**os.environ, **_SERVER_ENV})
        url = f"http://127.0.0.1:{port}/api"
        while time.monotonic() < deadline and proc.poll() is None:
            if _healthy(url):
                return proc, url
            time.sleep(0.2)
        if proc.poll() is None:
            break
    _stop(proc)
    raise PrefectStartError(
        f"Prefect's ephemeral API did not start within {timeout_s:g} s (a loaded machine): raise "
        f"{TIMEOUT_ENV}, or set PREFECT_API_URL to a running server (infra/services.sh up)")


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(port: int, parent: int, kernel: bool) -> None:
    from exgrpo_core.run.lifeline import die_with_parent

    die_with_parent(parent, kernel=kernel)
    import uvicorn

    uvicorn.run("prefect.server.api.server:create_app", factory=True, host="127.0.0.1", port=port,
                log_level="error", lifespan="on")


if __name__ == "__main__":
    _serve(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1")
