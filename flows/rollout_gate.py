"""The key check in front of a rollout server: `exgrpo rollout-server` with EXGRPO_ROLLOUT_API_KEY set.

vLLM's own key (VLLM_API_KEY) guards only its sampling routes; the RL routes that pause the server and
replace its weights (/pause, /init_weight_transfer_engine, /update_weights, /weight_checker, ...) take
requests from anyone who reaches the port. So `vllm serve` listens on no port at all: on a Unix socket
(`--uds`) in a folder of its own, mode 0700, which other local users cannot open; and this gate listens
where the trainer connects (--host/--port): it forwards a request only when it carries
`Authorization: Bearer <key>` (the trainer's ServerClient sends it), answers 401 otherwise, and lets only
`GET /health` through without the key. The body goes through unchanged, both ways.
"""

from __future__ import annotations

import hmac
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MIN_KEY_CHARS = 16  # the key is all that stands between a stranger and the server's weights


def short_key(key: str | None) -> str | None:
    """The one-line refusal of a set key shorter than MIN_KEY_CHARS, else None."""
    if key and len(key) < MIN_KEY_CHARS:
        return (f"EXGRPO_ROLLOUT_API_KEY has {len(key)} characters: use at least {MIN_KEY_CHARS} (e.g. "
                "`python -c 'import secrets; print(secrets.token_urlsafe(24))'`)")
    return None


OPEN = {("GET", "/health")}  # what a load balancer's probe may see without the key
_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-authorization"}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: TokenGate

    def _forward(self) -> None:
        path = self.path.split("?", 1)[0]
        if (self.command, path) not in OPEN and not self.server.allows(self.headers.get("Authorization", "")):
            self.close_connection = True  # its body is left unread
            self._answer(401, {"error": "missing or wrong API key (Authorization: Bearer $EXGRPO_ROLLOUT_API_KEY)"})
            return
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP | {"host", "content-length"}}
        conn = self.server.upstream_connection()
        try:
            conn.request(self.command, self.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        except OSError as e:
            self._answer(502, {"error": f"the vLLM server behind the gate did not answer ({e})"})
            return
        finally:
            conn.close()
        self.send_response(resp.status, resp.reason)
        for k, v in resp.getheaders():
            if k.lower() not in _HOP | {"content-length"}:
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _forward

    def _answer(self, code: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, fmt: str, *args) -> None:  # vLLM logs the requests it serves
        pass


class _UnixConnection(http.client.HTTPConnection):
    """An HTTP connection to a Unix socket (vLLM's --uds)."""

    def __init__(self, socket_path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = socket_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class TokenGate(ThreadingHTTPServer):
    """Listens at (host, port) and forwards requests with the right bearer key to `upstream`: a Unix socket's
    path (what `serve` uses) or a port on 127.0.0.1."""

    daemon_threads = True

    def __init__(self, host: str, port: int, upstream: str | int, key: str, timeout_s: float = 3600.0):
        if not key or short_key(key):
            raise ValueError(short_key(key) or "the gate needs a key")
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host, port), _Handler)
        self.upstream, self.timeout_s = upstream, timeout_s
        self._expected = f"Bearer {key}".encode()

    def allows(self, header: str) -> bool:
        return hmac.compare_digest(header.encode(), self._expected)

    def upstream_connection(self) -> http.client.HTTPConnection:
        if isinstance(self.upstream, str):
            return _UnixConnection(self.upstream, self.timeout_s)
        return http.client.HTTPConnection("127.0.0.1", self.upstream, timeout=self.timeout_s)


def private_socket_path() -> str:
    """A Unix socket's path in a new folder only this user may enter (0700); short enough for AF_UNIX."""
    base = None if len(tempfile.gettempdir()) < 60 else "/tmp"  # a socket path has at most 107 bytes
    return os.path.join(tempfile.mkdtemp(prefix="exgrpo-vllm-", dir=base), "vllm.sock")


def behind_gate(cmd: list[str], socket_path: str) -> list[str]:
    """The `vllm serve` command moved off the network onto the Unix socket `socket_path`: every --host /
    --port / --uds it has (also --flag=value and abbreviated) dropped, then `--uds socket_path` appended."""
    from exgrpo_core.rollout.remote import bind_flag

    out, rest = [], iter(cmd)
    for arg in rest:
        if bind_flag(arg):
            if "=" not in arg:
                next(rest, None)  # its value
            continue
        out.append(arg)
    return out + ["--uds", socket_path]


def serve(cmd: list[str], env: dict[str, str], host: str, port: int, key: str) -> int:
    """Run `cmd` (vllm serve) on a private Unix socket with the gate at host:port in front; returns vLLM's
    exit code. SIGTERM / SIGINT stop both."""
    inner = private_socket_path()
    gate = TokenGate(host, port, inner, key)
    proc = subprocess.Popen(behind_gate(cmd, inner), env={**os.environ, **env})

    def stop(signum, _frame) -> None:
        proc.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    thread = threading.Thread(target=gate.serve_forever, daemon=True)
    thread.start()
    try:
        return proc.wait()
    finally:
        gate.shutdown()
        gate.server_close()
        shutil.rmtree(os.path.dirname(inner), ignore_errors=True)
