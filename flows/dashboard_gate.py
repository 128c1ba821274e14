"""The login in front of the dashboard: `exgrpo dashboard` with EXGRPO_DASHBOARD_LOGIN (`user:password`) set.

Streamlit has no password login of its own (its `st.login` needs an OpenID provider), so Streamlit runs on
a free 127.0.0.1 port and this gate listens at --host:--port: every request but `GET /_stcore/health`
(a load balancer's probe) must carry HTTP basic auth with that login, else it gets 401 and the browser
asks for it. Each checked request gets a connection of its own (`Connection: close`), so nothing reaches
Streamlit unchecked on a kept-alive connection; the page's WebSocket is checked at its upgrade and then
passed through both ways. Basic auth sends the password in clear: across a network, put an SSH tunnel or
an HTTPS proxy in front (docs/dashboard.md).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import signal
import socket
import socketserver
import subprocess
import threading
import time

LOGIN_ENV = "EXGRPO_DASHBOARD_LOGIN"
MIN_PASSWORD_CHARS = 12
OPEN = (b"GET", b"/_stcore/health")
MAX_HEAD = 64 * 1024
REALM = b'Basic realm="exgrpo dashboard", charset="UTF-8"'


def login_problem(login: str | None) -> str | None:
    """The one-line refusal of a malformed login (`user:password`, password of 12 or more), else None."""
    user, sep, password = (login or "").partition(":")
    if not sep or not user:
        return f"{LOGIN_ENV} must be user:password"
    if len(password) < MIN_PASSWORD_CHARS:
        return f"{LOGIN_ENV}'s password has {len(password)} characters: use at least {MIN_PASSWORD_CHARS}"
    return None


def serving_problem(host: str, login: str | None) -> str | None:
    """Why `exgrpo dashboard --host HOST` must not start (one line), else None: a malformed login, or an
    address beyond loopback without one."""
    if login:
        return login_problem(login)
    if not is_loopback(host):
        return (f"--host {host} would serve the runs to anyone who reaches it: set {LOGIN_ENV}=user:password "
                "(docs/dashboard.md, Login)")
    return None


def mlflow_env(environ) -> tuple[dict[str, str], str]:
    """The dashboard's environment with MLflow's login swapped for the read-only one, and a note for its
    first line: EXGRPO_MLFLOW_READER_USER / _PASSWORD (`infra/services.sh env` exports them) replace
    MLFLOW_TRACKING_USERNAME / _PASSWORD, so the dashboard never reads MLflow as the admin."""
    env = {k: v for k, v in environ.items() if k not in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")}
    if environ.get("EXGRPO_MLFLOW_READER_PASSWORD"):
        user = environ.get("EXGRPO_MLFLOW_READER_USER") or "exgrpo_reader"
        env.update(MLFLOW_TRACKING_USERNAME=user, MLFLOW_TRACKING_PASSWORD=environ["EXGRPO_MLFLOW_READER_PASSWORD"])
        return env, f" (read-only login {user})"
    if environ.get("MLFLOW_TRACKING_PASSWORD"):
        return env, " (no MLflow login: EXGRPO_MLFLOW_READER_PASSWORD is not set, and the admin's is not used)"
    return env, ""


def _answer(sock: socket.socket, status: bytes, extra: bytes = b"") -> None:
    body = status + b"\n"
    sock.sendall(b"HTTP/1.1 " + status + b"\r\nContent-Type: text/plain\r\nContent-Length: "
                 + str(len(body)).encode() + b"\r\nConnection: close\r\n" + extra + b"\r\n" + body)


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while chunk := src.recv(65536):
            dst.sendall(chunk)
    except OSError:
        pass
    finally:
        for s in (src, dst):  # either side ending ends the exchange
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _Handler(socketserver.BaseRequestHandler):
    server: LoginGate

    def handle(self) -> None:
        sock = self.request
        sock.settimeout(30)
        head = b""
        try:
            while b"\r\n\r\n" not in head:
                chunk = sock.recv(65536)
                if not chunk:
                    return
                head += chunk
                if len(head) > MAX_HEAD:
                    return _answer(sock, b"431 Request Header Fields Too Large")
        except OSError:
            return
        header, rest = head.split(b"\r\n\r\n", 1)
        first, *lines = header.split(b"\r\n")
        parts = first.split(b" ")
        fields = [(k.strip().lower(), v.strip()) for k, _, v in (line.partition(b":") for line in lines)]
        if len(parts) != 3:
            return _answer(sock, b"400 Bad Request")
        probe = (parts[0], parts[1].split(b"?")[0]) == OPEN
        if not probe and not self.server.allows(dict(fields).get(b"authorization", b"")):
            time.sleep(0.3)  # a guesser pays for each try
            return _answer(sock, b"401 Unauthorized", b"WWW-Authenticate: " + REALM + b"\r\n")
        websocket = any(k == b"upgrade" and v.lower() == b"websocket" for k, v in fields)
        kept = [(k, v) for k, v in fields if k != b"authorization"
                and (websocket or k not in (b"connection", b"keep-alive"))]
        if not websocket:
            kept.append((b"connection", b"close"))
        try:
            upstream = socket.create_connection(("127.0.0.1", self.server.upstream_port), timeout=10)
        except OSError:
            return _answer(sock, b"502 Bad Gateway")
        sock.settimeout(None)
        upstream.settimeout(None)
        upstream.sendall(b"\r\n".join([first, *(k + b": " + v for k, v in kept)]) + b"\r\n\r\n" + rest)
        back = threading.Thread(target=_pump, args=(upstream, sock), daemon=True)
        back.start()
        _pump(sock, upstream)
        back.join()
        upstream.close()


class LoginGate(socketserver.ThreadingTCPServer):
    """Listens at (host, port); forwards requests carrying the login to 127.0.0.1:upstream_port."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, host: str, port: int, upstream_port: int, login: str):
        problem = login_problem(login)
        if problem:
            raise ValueError(problem)
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host, port), _Handler)
        self.upstream_port = upstream_port
        self._expected = login.encode()

    def allows(self, header: bytes) -> bool:
        scheme, _, token = header.partition(b" ")
        if scheme.lower() != b"basic":
            return False
        try:
            given = base64.b64decode(token.strip(), validate=True)
        except (binascii.Error, ValueError):
            return False
        return hmac.compare_digest(given, self._expected)


def free_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(cmd: list[str], env: dict[str, str], host: str, port: int, login: str, inner: int) -> int:
    """Run `cmd` (Streamlit, listening on 127.0.0.1:inner) with the gate at host:port in front; returns
    Streamlit's exit code. SIGTERM / SIGINT stop both."""
    gate = LoginGate(host, port, inner, login)
    proc = subprocess.Popen(cmd, env={k: v for k, v in env.items() if k != LOGIN_ENV})

    def stop(signum, _frame) -> None:
        proc.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    threading.Thread(target=gate.serve_forever, daemon=True).start()
    try:
        return proc.wait()
    finally:
        gate.shutdown()
        gate.server_close()


def is_loopback(host: str) -> bool:
    return host in ("127.0.0.1", "localhost", "::1") or host.startswith("127.")

