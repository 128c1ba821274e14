"""Reward functions of the user's (`reward.fn`, docs/rewards.md): found by `package.module:callable` or by
name in the entry-point group `exgrpo.rewards`, called as fn(row, response) in the verifier processes
with the per-item timeout that math-verify has (`RewardFunctionPool`).

A function returns a float in [0, 1], or (float, reason), or {"reward": float, "reason": str}. What
goes wrong with one item (an exception, NaN, a value out of range, a non-number, a hang) scores that
item 0 with a named reason ("error", "invalid", "timeout") and the message in its audit text; what
goes wrong with the function itself (it does not import, it does not take two arguments) is one
`RewardPluginError` line before training starts.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import math
import os
import sys
from importlib import metadata

from exgrpo_core.reward import grading
from exgrpo_core.run import lifeline
from exgrpo_core.types import Question

GROUP = "exgrpo.rewards"
"""Entry-point group of installed reward functions (pyproject `[project.entry-points."exgrpo.rewards"]`)."""
FAILURES = ("error", "invalid", "timeout")
"""Reasons of an item the function could not score; it scores 0."""
_DETAIL_CHARS = 300
_REASON_CHARS = 16  # the database's verify_reason column


class RewardPluginError(ValueError):
    """The reward function cannot be used at all (not found, does not import, wrong signature): one line."""


def resolve(spec: str):
    """The callable `spec` names: `package.module:attr` (attr may be dotted), else an installed reward's name.

    The working directory is searched after the installed packages, so `reward.fn=my_rewards:score`
    finds ./my_rewards.py. Raises RewardPluginError naming what is missing.
    """
    spec = spec.strip()
    if ":" not in spec:
        found = [ep for ep in metadata.entry_points(group=GROUP) if ep.name == spec]
        if not found:
            names = sorted({ep.name for ep in metadata.entry_points(group=GROUP)})
            raise RewardPluginError(f"reward.fn={spec!r} is neither package.module:callable nor an installed reward "
                                    f"(installed: {', '.join(names) or 'none'})")
        spec = found[0].value
    module_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        obj = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - any import-time failure of user code is the user's line
        raise RewardPluginError(f"reward.fn={spec!r}: importing {module_name!r} failed: {type(e).__name__}: "
                                f"{_one_line(e)}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise RewardPluginError(f"reward.fn={spec!r}: {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    check_signature(obj, spec)
    return obj


def check_signature(fn, spec: str) -> None:
    """RewardPluginError unless `fn` is callable with two positional arguments (row, response)."""
    if not callable(fn):
        raise RewardPluginError(f"reward.fn={spec!r} is a {type(fn).__name__}, not a function")
    try:
        inspect.signature(fn).bind({}, "")
    except TypeError as e:
        raise RewardPluginError(f"reward.fn={spec!r} must take (row, response): {_one_line(e)}") from None
    except ValueError:  # no signature to read (some builtins): let the first call decide
        pass


def version(spec: str) -> str:
    """A reward function's version for the audit: its distribution's version, else a hash of its module file.

    Example: "exact_match" -> "exgrpo-0.4.0"; "my_rewards:score" -> "file-3f2a9c1b".
    """
    target = spec if ":" in spec else next((ep.value for ep in metadata.entry_points(group=GROUP)
                                            if ep.name == spec), spec)
    top = target.partition(":")[0].split(".")[0]
    dists = metadata.packages_distributions().get(top)
    if dists:
        try:
            return f"{dists[0]}-{metadata.version(dists[0])}"
        except metadata.PackageNotFoundError:
            pass
    module = sys.modules.get(target.partition(":")[0])
    path = getattr(module, "__file__", None)
    if path and os.path.isfile(path):
        with open(path, "rb") as f:
            return "file-" + hashlib.sha1(f.read()).hexdigest()[:8]
    return "unknown"


def row_of(q: Question) -> dict:
    """What a reward function receives as `row`: the dataset row's own fields, then uid, question (the
    user message), answer, source, messages and prompt (ours win on a name clash)."""
    row = json.loads(q.info) if q.info else {}
    row.update(uid=q.uid, question=q.text, answer=q.answer, source=q.source, messages=[dict(m) for m in q.messages],
               prompt=q.prompt)
    return row


def score(value, binary: bool) -> tuple[float, str, str | None]:
    """(reward, reason, detail) of what a reward function returned; an unusable value is (0, "invalid", why)."""
    reason, detail = "scored", None
    if isinstance(value, dict):
        value, reason = value.get("reward"), value.get("reason", reason)
    elif isinstance(value, tuple) and len(value) == 2:
        value, reason = value
    if isinstance(value, bool):
        value = float(value)
    if not isinstance(value, (int, float)) and not hasattr(value, "__float__") or isinstance(value, str):
        return 0.0, "invalid", f"returned {type(value).__name__}, not a number"
    x = float(value)
    if not math.isfinite(x) or not 0.0 <= x <= 1.0:
        return 0.0, "invalid", f"returned {x!r}, outside [0, 1]"
    if binary and x not in (0.0, 1.0):
        return 0.0, "invalid", f"returned {x!r} in a binary run (reward.kind=continuous takes any value in [0, 1])"
    reason = str(reason) if reason is not None else "scored"
    if len(reason) > _REASON_CHARS:
        detail, reason = reason[:_DETAIL_CHARS], reason[:_REASON_CHARS]
    return x, reason, detail


def call(fn, row: dict, response: str, binary: bool) -> tuple[float, str, str | None]:
    """One item: fn(row, response) scored by `score`; an exception is (0, "error", its type and message)."""
    try:
        value = fn(row, response)
    except Exception as e:  # noqa: BLE001 - user code: every failure is that item's named failure
        return 0.0, "error", f"{type(e).__name__}: {_one_line(e)}"[:_DETAIL_CHARS]
    return score(value, binary)


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def _worker_main(conn, spec: str, binary: bool, paths: list[str], test_hooks: bool) -> None:
    """Worker loop: resolve the function once, then score each (response, row) item as it comes."""
    lifeline.die_with_parent()
    sys.path[:0] = [p for p in paths if p not in sys.path]  # the trainer's path (a forkserver keeps its own)
    try:
        fn = resolve(spec)
    except RewardPluginError as e:
        conn.send(("error", str(e)))
        return
    grading.serve_items(conn, lambda response, row: call(fn, row, response, binary), test_hooks)


class RewardFunctionPool(grading.MathVerifier):
    """`reward.fn` in killable worker processes: per-item timeout, a hung or crashed item scored 0 and its
    worker replaced (the machinery of `grading.MathVerifier`). `score_rows` is thread-safe."""

    def __init__(self, spec: str, timeout_s: float = 5.0, workers: int = 1, binary: bool = False):
        self.spec, self.binary = spec, binary
        super().__init__(timeout_s, False, workers)
        try:
            for w in self._workers:
                w.wait_ready()  # an unusable function is one line now, not at the first step
        except grading.WorkerStartError as e:
            self.close()
            raise RewardPluginError(str(e)) from None

    def _spawn(self):
        return grading._Worker(self._ctx, self.spec, self.binary, list(sys.path), self._test_hooks,
                               target=_worker_main)

    def score_rows(self, responses: list[str], rows: list[dict]) -> list[tuple[float, str, str | None]]:
        """(reward, reason, detail) of each response against its row; "timeout" past timeout_s."""
        if len(responses) != len(rows):
            raise ValueError(f"score_rows got {len(responses)} responses but {len(rows)} rows")
        if self._closed:
            raise RuntimeError("RewardFunctionPool is closed")
        with self._lock:
            out = self._run([(str(r), row) for r, row in zip(responses, rows)])
        return [res if len(res) == 3 else (res[0], res[1], f"no score within {self.timeout_s:g} s"
                                           if res[1] == "timeout" else "the worker died on this item")
                for res in out]
