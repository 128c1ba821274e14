"""Where a run's training rewards come from (`reward.fn`, `reward.url`, else math-verify), and the grading
step for the first two: rewards, reasons and the audit fields written into the records.
"""

from __future__ import annotations

import os
import warnings
from collections import Counter

from exgrpo_core.reward import plugins
from exgrpo_core.reward.remote import RewardServer
from exgrpo_core.types import Question, Rollout

LABELS = {"fn": "reward_fn", "url": "reward_url"}
"""The audit's grader name of each source (the `verifier` column)."""


def open_source(cfg):
    """The reward function's pool or the reward server's client `cfg` (RewardConfig) names; None for
    math-verify. Raises plugins.RewardPluginError / remote.RewardServerError as one line."""
    binary = not cfg.continuous
    if cfg.fn:
        return plugins.RewardFunctionPool(cfg.fn, cfg.timeout_s, cfg.workers, binary=binary)
    if cfg.url:
        server = RewardServer(cfg.url, cfg.url_api_key or os.environ.get("EXGRPO_REWARD_API_KEY"),
                              cfg.url_timeout_s, cfg.url_retries, cfg.url_batch_size, binary=binary)
        server.check()
        return server
    return None


def check(cfg) -> bool:
    """Before anything slow: the reward function imports and takes (row, response), or the server answers
    its health check; one line if not. False when the run grades with math-verify."""
    source = open_source(cfg)
    if source is None:
        return False
    if hasattr(source, "close"):
        source.close()
    return True


def describe(cfg) -> tuple[str, str]:
    """(grader name, version) recorded per trajectory: ("reward_fn", "<spec>@<version>") or ("reward_url", url)."""
    if cfg.fn:
        return LABELS["fn"], f"{cfg.fn}@{plugins.version(cfg.fn)}"[:100]
    from exgrpo_core.config.redact import mask_text
    return LABELS["url"], mask_text(cfg.url)[:100]


def grade(source, rollouts: list[Rollout], questions: list[Question], label: str, version: str) -> Counter:
    """Score each rollout against its question with the reward function or server and write reward, reason
    and audit fields (prediction: the function's own words, or why it failed; gold: the row's answer).
    Returns the count of each failure reason ("error", "invalid", "timeout")."""
    results = source.score_rows([r.text for r in rollouts], [plugins.row_of(q) for q in questions])
    failed: Counter = Counter()
    for r, q, (reward, reason, detail) in zip(rollouts, questions, results):
        r.reward, r.reason = float(reward), reason
        r.prediction, r.gold = detail, q.answer
        r.verifier, r.verifier_version = label, version
        if reason in plugins.FAILURES:
            failed[reason] += 1
    return failed


_WARNED: set[tuple[str, str]] = set()


def warn_failures(cfg, rollouts: list[Rollout], failed: Counter) -> None:
    """One warning per new kind of failure, naming the reward, the reason, a question and the message;
    every failure is counted in `verify/errors` / `verify/timeouts` whether warned or not."""
    if not failed:
        return
    name = cfg.fn or "the reward server"
    for r in rollouts:
        key = (r.reason, (r.prediction or "").split(":", 1)[0])
        if r.reason in plugins.FAILURES and key not in _WARNED:
            _WARNED.add(key)
            counts = ", ".join(f"{n} {why}" for why, n in sorted(failed.items()))
            warnings.warn(f"reward {name}: {sum(failed.values())} of {len(rollouts)} items scored 0 this step "
                          f"({counts}); e.g. question {r.question_uid}: {r.reason}: {r.prediction}", stacklevel=2)
