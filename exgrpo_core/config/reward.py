"""`reward.*`: how responses are graded (math-verify, a reward function of the user's, or a reward
server) and whether rewards are 0/1 or continuous (part of the config tree in schema.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from exgrpo_core.config.base import _Section


class RewardConfig(_Section):
    timeout_s: float = Field(default=5.0, gt=0)
    """Per-item verification timeout; a timeout scores 0 and is counted (docs/implementation_details.md).
    Also a reward function's per-item limit (`fn`)."""
    require_think: bool = False
    """(code) Require a `<think>...</think>` block and grade only the text after it."""
    workers: int = Field(default=1, ge=1)
    """Verifier processes (math-verify, or `fn`, runs in separate processes so a hang can be killed)."""
    truncated: Literal["grade", "zero"] = "grade"
    """Responses cut at rollout.max_response_tokens: grade them like any other (code), or score them 0
    (the last-number fallback can reward a cut-off response, which would then be stored and replayed
    without EOS). Counted either way in `verify/truncated_rewarded`."""
    fn: str | None = None
    """A reward function of your own instead of math-verify: `package.module:callable`, or the name of an
    installed one (entry-point group `exgrpo.rewards`; shipped: exact_match, arith_format). It is called as
    fn(row, response) -> float in [0, 1], or (float, reason), or {"reward": float, "reason": str}, in
    the verifier processes with the per-item timeout (docs/rewards.md)."""
    url: str | None = None
    """A reward server instead of math-verify: POST {url} with {"items": [{row..., "response": ...}]},
    answered by {"rewards": [float or {"reward", "reason"}]} (docs/rewards.md). A password in the URL is
    masked wherever the config is recorded."""
    url_api_key: str | None = None
    """(url) Sent as `Authorization: Bearer <key>`; default: the EXGRPO_REWARD_API_KEY environment variable."""
    url_timeout_s: float = Field(default=60.0, gt=0)
    """(url) Seconds one batch request may take."""
    url_retries: int = Field(default=3, ge=0)
    """(url) Retries of a failed batch request (connection error, timeout, HTTP 5xx or 429), 1 s, 2 s, 4 s
    apart; then the run stops with one line and resumes from its last checkpoint."""
    url_batch_size: int = Field(default=64, ge=1)
    """(url) Items per request."""
    kind: Literal["auto", "binary", "continuous"] = "auto"
    """binary: rewards are 0 or 1 (the paper's main setting: buckets by correct count); continuous: any
    value in [0, 1], questions bucketed by the spread of their group's rewards (paper v2 §5.3,
    docs/rewards.md). auto: binary for math-verify, continuous for `fn` / `url`. A binary run scores
    a reward function's value outside {0, 1} as an invalid item."""

    @property
    def continuous(self) -> bool:
        """Whether the run's rewards are continuous (`kind`, auto resolved)."""
        return self.kind == "continuous" or (self.kind == "auto" and bool(self.fn or self.url))

    @model_validator(mode="after")
    def _one_source(self):
        if self.fn and self.url:
            raise ValueError("reward.fn and reward.url are two reward sources: set one of them")
        if self.fn is not None and not self.fn.strip():
            raise ValueError("reward.fn is empty: give package.module:callable or an installed reward's name")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"reward.url must be an http:// or https:// address (got {self.url!r})")
        if self.require_think and (self.fn or self.url):
            raise ValueError("reward.require_think applies to math-verify only: a reward function reads the "
                             "whole response itself")
        return self
