"""reward.url: a real reward server process (`python -m exgrpo_core.reward.serve`) scores batches behind
a key; a flaky or silent server is retried, then one line with the credentials masked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from exgrpo_core.reward.remote import RewardServer, RewardServerError

KEY = "reward-key-0123456789abcdef"


@pytest.fixture(scope="module")
def served():
    env = {**os.environ, "EXGRPO_REWARD_API_KEY": KEY}
    proc = subprocess.Popen([sys.executable, "-m", "exgrpo_core.reward.serve", "--fn", "arith_format", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    assert line.startswith("serving reward arith_format on http://127.0.0.1:"), (line, proc.stderr.read())
    yield line.split(" on ")[1].strip()
    proc.kill()
    proc.wait(10)


def test_a_real_reward_server_scores_in_batches_behind_its_key(served):
    client = RewardServer(served, api_key=KEY, batch_size=2)
    client.check()
    rows = [{"answer": str(n)} for n in range(5)]
    got = client.score_rows([f"\\boxed{{{n}}}" for n in range(4)] + ["no idea"], rows)
    assert [r for r, _, _ in got[:4]] == [0.999] * 4 and got[4][0] == pytest.approx(0.098)
    assert [why for _, why, _ in got] == ["right+boxed"] * 4 + ["wrong"]
    assert client.requests == 1 + 3  # the health check, then 5 items 2 per request
    with pytest.raises(RewardServerError, match="answered HTTP 401 .*EXGRPO_REWARD_API_KEY"):
        RewardServer(served, api_key="wrong-key").check()


def test_a_bad_function_stops_the_server_at_start_in_one_line():
    out = subprocess.run([sys.executable, "-m", "exgrpo_core.reward.serve", "--fn", "no_such_reward"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "no_such_reward" in out.stderr


class _Flaky(BaseHTTPRequestHandler):
    plan: list = []

    def do_POST(self):  # noqa: N802
        n = len(json.loads(self.rfile.read(int(self.headers["Content-Length"])))["items"])
        what = self.plan.pop(0) if self.plan else "ok"
        if what == "slow":
            time.sleep(1.0)
        code, body = {"503": (503, {}), "ok": (200, {"rewards": [0.5] * n}), "slow": (200, {"rewards": [0.5] * n}),
                      "short": (200, {"rewards": [0.5] * max(n - 1, 0)}), "junk": (200, None)}[what]
        data = b"<html>" if body is None else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def flaky():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    server.handle_error = lambda *a: None  # the timed-out client hung up on a slow answer
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()


def _client(server, **kw) -> RewardServer:
    return RewardServer(f"http://user:s3cret@127.0.0.1:{server.server_address[1]}/score", backoff_s=0.01, **kw)


def test_a_flaky_server_is_retried_and_a_dead_one_is_one_masked_line(flaky):
    _Flaky.plan = ["503", "503", "ok"]
    client = _client(flaky, retries=3)
    assert client.score_rows(["a", "b"], [{}, {}]) == [(0.5, "scored", None)] * 2 and client.requests == 3
    _Flaky.plan = ["503"] * 4
    with pytest.raises(RewardServerError) as e:
        _client(flaky, retries=2).score_rows(["a"], [{}])
    message = str(e.value)
    assert "did not answer after 3 tries (last: HTTP 503" in message and "resumes from its last checkpoint" in message
    assert "s3cret" not in message and "user:***@" in message


@pytest.mark.parametrize("what, words", [("short", "answered 1 rewards for 2 items"),
                                         ("junk", "did not answer with JSON")])
def test_a_server_that_breaks_the_protocol_is_not_retried(flaky, what, words):
    _Flaky.plan = [what]
    client = _client(flaky, retries=3)
    with pytest.raises(RewardServerError, match=words):
        client.score_rows(["a", "b"], [{}, {}])
    assert client.requests == 1


def test_a_silent_server_times_out_per_request(flaky):
    _Flaky.plan = ["slow", "slow"]
    client = _client(flaky, retries=1, timeout_s=0.3)
    with pytest.raises(RewardServerError, match="after 2 tries"):
        client.score_rows(["a"], [{}])
