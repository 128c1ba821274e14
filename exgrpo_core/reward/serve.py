"""Serve a reward function over HTTP in the protocol of `reward.url` (exgrpo_core/reward/remote.py):

    python -m exgrpo_core.reward.serve --fn arith_format --port 8010 [--host 127.0.0.1] [--workers 2]

The function runs in killable worker processes with the per-item timeout (`RewardFunctionPool`).
With EXGRPO_REWARD_API_KEY set, requests must carry `Authorization: Bearer <key>` (else 401).
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from exgrpo_core.reward.plugins import RewardFunctionPool, RewardPluginError

MAX_BODY = 64 << 20


def make_handler(pool: RewardFunctionPool, key: str | None):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            if key and not hmac.compare_digest(self.headers.get("Authorization", ""), f"Bearer {key}"):
                return self._send(401, {"error": "missing or wrong Bearer key"})
            size = int(self.headers.get("Content-Length") or 0)
            if size > MAX_BODY:
                return self._send(413, {"error": f"body over {MAX_BODY} bytes"})
            try:
                items = json.loads(self.rfile.read(size))["items"]
                rows = [{k: v for k, v in item.items() if k != "response"} for item in items]
                responses = [str(item["response"]) for item in items]
            except (ValueError, KeyError, TypeError, AttributeError):
                return self._send(400, {"error": 'expected {"items": [{..., "response": str}]}'})
            scored = pool.score_rows(responses, rows)
            self._send(200, {"rewards": [{"reward": r, "reason": why} for r, why, _ in scored]})

        def _send(self, code: int, body: dict):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):  # one line per request is noise for a training run
            pass

    return Handler


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m exgrpo_core.reward.serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--fn", required=True, help="package.module:callable, or an installed reward's name")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8010)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--timeout-s", type=float, default=5.0)
    p.add_argument("--binary", action="store_true", help="refuse values other than 0 and 1 (reward.kind=binary)")
    a = p.parse_args(argv)
    try:
        pool = RewardFunctionPool(a.fn, a.timeout_s, a.workers, binary=a.binary)
    except RewardPluginError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    server = ThreadingHTTPServer((a.host, a.port), make_handler(pool, os.environ.get("EXGRPO_REWARD_API_KEY")))
    print(f"serving reward {a.fn} on http://{a.host}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        pool.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
