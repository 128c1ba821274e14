"""A reward server (`reward.url`, docs/rewards.md): rewards from a service that lives elsewhere (a reward
model on its own GPUs), in batches, with timeouts and retries.

The protocol: POST {url} with JSON {"items": [{<row fields>..., "response": str}, ...]}; the answer is
{"rewards": [r, ...]}, one per item in order, each a number in [0, 1] or {"reward": x, "reason": str}.
An empty batch is the health check (`check`). `python -m exgrpo_core.reward.serve` serves any
`reward.fn` this way. A credential comes from the URL's user:password (HTTP basic) or `api_key`
(Bearer); neither is ever written down (`redact.mask_text` in every message here).
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit, urlunsplit

from exgrpo_core.config.redact import mask_text
from exgrpo_core.reward import plugins

_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})


class RewardServerError(RuntimeError):
    """The reward server cannot be used (unreachable after the retries, or it broke the protocol): one line."""


class RewardServer:
    """Client of one reward server. `score_rows` is the training loop's grading (thread-compatible, no state)."""

    def __init__(self, url: str, api_key: str | None = None, timeout_s: float = 60.0, retries: int = 3,
                 batch_size: int = 64, binary: bool = False, backoff_s: float = 1.0):
        parts = urlsplit(url)
        self.shown = mask_text(url)
        self.url = urlunsplit(parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port else "")))
        self.headers = {"Content-Type": "application/json"}
        if parts.username is not None:
            pair = f"{parts.username}:{parts.password or ''}".encode()
            self.headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.timeout_s, self.retries, self.batch_size = timeout_s, retries, batch_size
        self.binary, self.backoff_s = binary, backoff_s
        self.requests = 0
        """Requests sent, retries included (a metric for tests and the benchmark)."""

    def check(self) -> None:
        """The health check before training: an empty batch must come back as {"rewards": []}."""
        self._post([])

    def score_rows(self, responses: list[str], rows: list[dict]) -> list[tuple[float, str, str | None]]:
        """(reward, reason, detail) of each response against its row, `batch_size` items per request."""
        if len(responses) != len(rows):
            raise ValueError(f"score_rows got {len(responses)} responses but {len(rows)} rows")
        items = [{**row, "response": str(resp)} for resp, row in zip(responses, rows)]
        out: list[tuple[float, str, str | None]] = []
        for start in range(0, len(items), self.batch_size):
            out += [plugins.score(v, self.binary) for v in self._post(items[start:start + self.batch_size])]
        return out

    def _post(self, items: list[dict]) -> list:
        body = json.dumps({"items": items}, default=str).encode()
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            self.requests += 1
            request = urllib.request.Request(self.url, data=body, headers=self.headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
                    return self._rewards(reply.read(), len(items))
            except urllib.error.HTTPError as e:
                if e.code not in _RETRY_STATUS:
                    raise RewardServerError(f"reward server {self.shown} answered HTTP {e.code} {e.reason}"
                                            f"{' (check reward.url_api_key / EXGRPO_REWARD_API_KEY)' if e.code in (401, 403) else ''}") from None
                last = f"HTTP {e.code} {e.reason}"
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as e:
                last = mask_text(str(getattr(e, "reason", e)) or type(e).__name__)
        raise RewardServerError(f"reward server {self.shown} did not answer after {self.retries + 1} tries "
                                f"(last: {last}); the run stops here and resumes from its last checkpoint")

    def _rewards(self, raw: bytes, n: int) -> list:
        try:
            rewards = json.loads(raw)["rewards"]
        except (ValueError, KeyError, TypeError):
            raise RewardServerError(f"reward server {self.shown} did not answer with JSON {{\"rewards\": [...]}} "
                                    f"(got {raw[:80]!r})") from None
        if not isinstance(rewards, list) or len(rewards) != n:
            got = len(rewards) if isinstance(rewards, list) else type(rewards).__name__
            raise RewardServerError(f"reward server {self.shown} answered {got} rewards for {n} items")
        return rewards
