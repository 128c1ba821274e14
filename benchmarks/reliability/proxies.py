"""Proxies that make a service fail on cue, for the dependency-outage faults (tests and scenarios.py):
`TcpProxy` in front of PostgreSQL (stopped: every connection through it cut; started again on its port),
`FailingHttpProxy` in front of an MLflow server (answers HTTP 503 while `failing` is set)."""

from __future__ import annotations

import http.server
import socket
import threading
import time
import urllib.error
import urllib.request


class TcpProxy:
    """A TCP proxy to 127.0.0.1:`target_port` on `port` (0: a free one) that can be stopped and started."""

    def __init__(self, target_port: int = 5432, port: int = 0):
        self.target = ("127.0.0.1", target_port)
        self.start(port)

    def start(self, port: int) -> None:
        self.socks, self.open = [], True
        self.server = socket.create_server(("127.0.0.1", port))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while self.open:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.socks += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a, b):
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def stop(self):
        self.open = False
        try:
            self.server.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept(); close() alone would not
        except OSError:
            pass
        self.server.close()
        for s in self.socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def outage(self, seconds: float) -> threading.Thread:
        """Stop now, start again on the same port after `seconds` (in a thread, returned; `self` is the
        running proxy again once it has ended)."""
        self.stop()

        def back():
            time.sleep(seconds)
            self.start(self.port)

        t = threading.Thread(target=back, daemon=True)
        t.start()
        return t


class FailingHttpProxy:
    """An HTTP proxy to `upstream` on a free port; while `failing` is set every request gets 503 and never
    reaches the server. `answered_503` counts those."""

    def __init__(self, upstream: str):
        proxy = self
        self.upstream, self.failing, self.answered_503 = upstream.rstrip("/"), False, 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def _any(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if proxy.failing:
                    proxy.answered_503 += 1
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                req = urllib.request.Request(proxy.upstream + self.path, data=body or None, method=self.command,
                                             headers={k: v for k, v in self.headers.items()
                                                      if k.lower() not in ("host", "connection")})
                try:
                    resp = urllib.request.urlopen(req, timeout=120)
                except urllib.error.HTTPError as e:
                    resp = e
                data = resp.read()
                self.send_response(resp.status if hasattr(resp, "status") else resp.code)
                for k, v in resp.headers.items():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection", "date", "server"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _any

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def fail_for(self, seconds: float) -> threading.Thread:
        """Answer 503 from now on for `seconds` (in a thread, returned)."""
        self.failing = True

        def back():
            time.sleep(seconds)
            self.failing = False

        t = threading.Thread(target=back, daemon=True)
        t.start()
        return t

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_http(url: str, proc, timeout_s: float = 300) -> None:
    """Wait until `url` answers (a server process `proc` starting); fails when it exits or times out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server for {url} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(1)
    raise RuntimeError(f"{url} did not answer within {timeout_s} s")
