"""Rule-based reward r in {0, 1} (docs/implementation_details.md): final-answer extraction + math-verify equivalence, and the
final choice letter for multiple-choice rows.

`grade` is the pure rule: last `\\boxed{...}` (else the last number / fraction) of the response,
parsed and compared with the gold by math-verify; model output is parsed, never executed.
`MathVerifier` runs `grade` in worker processes (forkserver/spawn, never fork: callers hold torch
threads) so that a per-item timeout can kill a hung sympy call; math-verify's own signal alarms work
only in a main thread and are switched off here. (code) requires a `<think>` block: `require_think`.
Multiple-choice rows (`grader_for`) are graded by `grade_choice`, regular expressions in the calling
process; `grade_rows` sends each row to its grader. Neither grader ever executes model output."""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import re
import threading
import time
import weakref
from collections import deque
from multiprocessing.connection import wait

from exgrpo_core.run import lifeline

RULES_VERSION = "1"
"""Version of the extraction and grading rules here; bump it when a change can change a reward (audit)."""
REASONS = ("correct", "wrong", "no_answer", "ambiguous", "no_think", "timeout", "error")
TEST_HOOKS_ENV = "EXGRPO_VERIFY_TEST_HOOKS"
"""When "1" at MathVerifier construction, a response containing `_test_sleep(SECONDS)` makes the
worker sleep that long before grading it: the only way tests can hit a real timeout deterministically."""
_TEST_SLEEP = re.compile(r"_test_sleep\((\d+(?:\.\d+)?)\)")
_STARTUP_TIMEOUT_S = 120.0

_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
_THINK = re.compile(r"<think>.*</think>", re.S)
# Last number (1,234.5 or 3/4, optional sign) or LaTeX fraction; a '-' right after a word is an operator.
_FINAL = re.compile(r"(?<![\w)])-?\\[dt]?frac\{[^{}]*\}\{[^{}]*\}"
                    r"|(?<![\w)])-?\d+(?:,\d{3})*(?:\.\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def extract_final_answer(text: str) -> str | None:
    """The response's final answer: the last non-empty `\\boxed{...}` (braces balanced), else the last number.

    Example: "so 2+3 = \\boxed{5}." -> "5"; "2 + 3 = 5." -> "5"; "1,234 apples" -> "1234"; "hello" -> None.
    """
    for match in reversed(list(_BOX.finditer(text))):
        content = _braced(text, match.end())
        if content is not None and content.strip():
            return content.strip()
    numbers = _FINAL.findall(text)
    if not numbers:
        return None
    return _THOUSANDS.sub("", numbers[-1]).strip()


def _braced(text: str, start: int) -> str | None:
    """Content from `start` (just after an opening brace) to its matching close; None if unbalanced."""
    depth = 1
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start:i]
    return None


def gold_text(answer: str) -> str:
    """Ground truth as LaTeX math: GSM8K's "... #### 1,234" -> "$1234$"; "\\frac{1}{2}" -> "$\\frac{1}{2}$"."""
    answer = answer.strip()
    if "####" in answer:
        answer = _THOUSANDS.sub("", answer.rsplit("####", 1)[1].strip())
    if re.search(r"(?<!\\)\$|\\boxed|\\\(|\\\[", answer):
        return answer
    return f"${answer}$"


@functools.lru_cache(maxsize=4096)
def _parse_gold(answer: str) -> list:
    """Parse each gold once per process (a group's K responses share it)."""
    from math_verify import parse
    return parse(gold_text(answer), parsing_timeout=None)


def grade(response: str, answer: str, *, require_think: bool = False) -> tuple[float, str]:
    """The reward: 1.0 when the final answer verifies as equal to the gold, else 0.0, with the reason.

    Runs without any timeout: call it through `MathVerifier` when the input is untrusted.

    Args:
        response: the model's text.
        answer: ground truth (plain, LaTeX, or GSM8K `#### N`).
        require_think: (code) demand a `<think>...</think>` block and grade only the text after it.

    Returns:
        (reward, reason), reason in "correct", "wrong", "no_answer", "no_think", "error".
    """
    from math_verify import parse, verify
    if require_think:
        think = _THINK.search(response)
        if think is None:
            return 0.0, "no_think"
        response = response[think.end():]
    predicted = extract_final_answer(response)
    if predicted is None:
        return 0.0, "no_answer"
    try:
        gold = _parse_gold(answer)
        if not gold:
            return 0.0, "error"  # the dataset's answer is unparseable: a data problem, counted as such
        parsed = parse("\\boxed{" + predicted + "}", parsing_timeout=None)
        if not parsed:
            return 0.0, "no_answer"
        ok = verify(gold, parsed, timeout_seconds=None)
    except Exception:  # noqa: BLE001 - sympy raises anything; the reason records it
        return 0.0, "error"
    return (1.0, "correct") if ok else (0.0, "wrong")


def _check_gold(answer: str) -> tuple[float, str]:
    try:
        return (1.0, "ok") if _parse_gold(answer) else (0.0, "error")
    except Exception:  # noqa: BLE001
        return 0.0, "error"


def _worker_main(conn, require_think: bool, test_hooks: bool) -> None:
    """Worker loop: receive a list of (response, answer), send one (reward, reason) per item as it is done."""
    lifeline.die_with_parent()  # and PR_SET_PDEATHSIG from the forkserver: never outlive the trainer
    import logging
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout disabled" notice: we time out here
    import math_verify  # noqa: F401  - pay the import before announcing readiness
    serve_items(conn, lambda response, answer: _check_gold(answer) if response is None  # a gold to check once
                else grade(response, answer, require_think=require_think), test_hooks)


def serve_items(conn, score, test_hooks: bool) -> None:
    """A verifier process's loop: say "ready", then send score(response, payload) for each item of each
    batch received, one message per item as it is done, until None or the pipe closes."""
    conn.send("ready")
    while True:
        try:
            batch = conn.recv()
        except EOFError:
            return
        if batch is None:
            return
        for response, payload in batch:
            if test_hooks and response is not None and (sleep := _TEST_SLEEP.search(response)):
                time.sleep(float(sleep.group(1)))
            conn.send(score(response, payload))


def _context():
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        # workers fork from a server that imported math-verify and that dies with the trainer
        ctx.set_forkserver_preload([lifeline.FORKSERVER_PRELOAD, __name__])
        return ctx
    return mp.get_context("spawn")


class WorkerStartError(RuntimeError):
    """A verifier process could not start its grader (a reward function that does not import): one line."""


class _Worker:
    """One verification process and its end of the pipe; `target(conn, *args)` is its loop (default: math-verify's)."""

    def __init__(self, ctx, *args, target=None):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=target or _worker_main, args=(child, *args), daemon=True)
        self.proc.start()
        child.close()
        self.ready = False
        self.pending: deque[int] = deque()  # item indices sent and not yet answered, in order
        self.deadline = 0.0

    def wait_ready(self) -> None:
        if not self.ready:
            if not self.conn.poll(_STARTUP_TIMEOUT_S):
                self.kill()
                raise RuntimeError(f"math-verify worker did not start within {_STARTUP_TIMEOUT_S:.0f} s")
            try:
                hello = self.conn.recv()
            except EOFError:
                hello = ("error", "the verifier process exited while starting")
            if hello != "ready":  # ("error", one line)
                self.kill()
                raise WorkerStartError(hello[1])
            self.ready = True

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(5)
        self.conn.close()

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except (OSError, ValueError):
            pass
        self.proc.join(2)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        self.conn.close()


def _stop_all(workers: list[_Worker]) -> None:
    for w in workers:
        w.stop()


class MathVerifier:
    """Pool of math-verify worker processes with a per-item timeout that kills and replaces a hung worker.

    Use as a context manager. `verify` is thread-safe (calls are serialised); the pool lives across
    calls, and each worker receives its share of a call's items in one message.
    """

    def __init__(self, timeout_s: float = 5.0, require_think: bool = False, workers: int = 1):
        if timeout_s <= 0 or workers < 1:
            raise ValueError(f"MathVerifier needs timeout_s > 0 and workers >= 1 (got {timeout_s}, {workers})")
        self.timeout_s = float(timeout_s)
        self.require_think = require_think
        self.timeouts = 0
        """Items scored 0 because they ran past timeout_s (a metric), over the pool's life."""
        self._ctx = _context()
        self._test_hooks = os.environ.get(TEST_HOOKS_ENV) == "1"
        self._workers = [self._spawn() for _ in range(workers)]
        self._lock = threading.Lock()
        self._closed = False
        self._bad_golds: set[str] = set()  # golds check_golds found unusable: scored "error" without a worker
        self._finalizer = weakref.finalize(self, _stop_all, self._workers)

    def _spawn(self) -> _Worker:
        return _Worker(self._ctx, self.require_think, self._test_hooks)

    def __enter__(self) -> "MathVerifier":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the workers (idempotent)."""
        self._closed = True
        self._finalizer()

    def verify(self, responses: list[str], answers: list[str]) -> list[tuple[float, str]]:
        """Grade responses[i] against answers[i]; an item past timeout_s scores (0.0, "timeout").

        Returns:
            One (reward, reason) per item, in order; reasons as `grade`, plus "timeout" and "error"
            (the worker died on that item).
        """
        if len(responses) != len(answers):
            raise ValueError(f"verify got {len(responses)} responses but {len(answers)} answers")
        if self._closed:
            raise RuntimeError("MathVerifier is closed")
        with self._lock:
            items = [(str(r), str(a)) for r, a in zip(responses, answers)]
            todo = [i for i, (_, a) in enumerate(items) if a not in self._bad_golds]
            out: list[tuple[float, str]] = [(0.0, "error")] * len(items)
            for i, res in zip(todo, self._run([items[i] for i in todo])):
                out[i] = res
            return out

    def check_golds(self, answers: list[str]) -> dict[str, str]:
        """Parse each distinct gold answer once, in the workers with the per-item timeout; returns the
        unusable ones -> "timeout" or "error" (unparseable). They are remembered: `verify` scores them
        (0.0, "error") at once, so a pathological gold never costs a timeout twice."""
        golds = sorted({str(a) for a in answers})
        with self._lock:
            before = self.timeouts  # the timeout metric counts graded responses only
            results = self._run([(None, g) for g in golds])  # type: ignore[misc]
            self.timeouts = before
        bad = {g: reason for g, (_, reason) in zip(golds, results) if reason != "ok"}
        self._bad_golds |= set(bad)
        return bad

    def _run(self, items: list[tuple[str, str]]) -> list[tuple[float, str]]:
        results: list[tuple[float, str] | None] = [None] * len(items)
        if not items:
            return []
        share = -(-len(items) // len(self._workers))  # ceil: contiguous shares keep a group together
        for w, start in zip(range(len(self._workers)), range(0, len(items), share)):
            self._send(w, list(range(start, min(start + share, len(items)))), items)
        while busy := [w for w in self._workers if w.pending]:
            now = time.monotonic()
            wait([w.conn for w in busy], timeout=max(0.0, min(w.deadline for w in busy) - now))
            for i, worker in enumerate(self._workers):
                if worker.pending:
                    self._collect(i, worker, items, results)
        return results  # type: ignore[return-value]

    def _send(self, w: int, indices: list[int], items: list[tuple[str, str]]) -> None:
        worker = self._workers[w]
        worker.wait_ready()
        worker.conn.send([items[i] for i in indices])
        worker.pending = deque(indices)
        worker.deadline = time.monotonic() + self.timeout_s

    def _collect(self, w: int, worker: _Worker, items, results) -> None:
        """Read what worker w has finished; replace it when its current item hung or it died."""
        try:
            while worker.pending and worker.conn.poll():
                results[worker.pending.popleft()] = worker.conn.recv()
                worker.deadline = time.monotonic() + self.timeout_s
            if not worker.pending or time.monotonic() < worker.deadline:
                return
            reason = "timeout"
        except (EOFError, OSError):
            reason = "error"
        results[worker.pending.popleft()] = (0.0, reason)
        self.timeouts += reason == "timeout"
        rest = list(worker.pending)
        worker.kill()
        self._workers[w] = self._spawn()  # in place: the finalizer holds this same list
        if rest:
            self._send(w, rest, items)


# ---- multiple choice ------------------------------------------------------------------------------
CHOICE_SOURCES = frozenset({"arc_c", "gpqa", "gpqa_diamond", "mmlu_pro"})
"""verl `data_source` values graded by their final choice letter (ExGRPO Table 1's OOD benchmarks)."""
GRADERS = ("math", "choice")

# Where a choice is announced: "answer is", "Answer:", "the correct option is", "choice would be".
_CUE = re.compile(r"(?i:\banswer\s*[:=]|\b(?:answer|option|choice)\s*(?:is|would\s+be|should\s+be|will\s+be)\b)")
# "Option C is correct" / "choice (B) is the right one" (the label comes before the verdict).
_VERDICT = re.compile(r"(?i:\b(?:option|choice))\s+\(?([A-Ja-j]|[1-9])\)?\s+is\s+(?:the\s+)?"
                      r"(?i:correct|right|best)\b")
_WORD = re.compile(r"(?i:option|choice)[ \t]+")
_SEP = re.compile(r"[ \t]*(?:,|/|&|\bor\b|\band\b)")
_TAIL_ONLY = re.compile(r"[ \t*_$.)\]]*(?:\n|$)")
_PRONOUN = re.compile(r"[ \t]+[a-z]")
_DECIMAL = re.compile(r"\.\d")
_MARKUP = re.compile(r"\\(?:text|textbf|mathrm|mathbf|rm|bf)\s*\{([^{}]*)\}")
_LEAD = " \t*_$:"
_BOX_CONTENT = re.compile(r"((?:[^{}]|\{[^{}]*\})*)\}")
"""A choice box's content, one level of inner braces (\\text{C}); read at most _BOX_CHARS characters."""
_BOX_CHARS = 300


def grader_for(source: str, style: str = "") -> str:
    """The grader of one row: its reward style when that names one ("math", "choice"), else by data_source.

    Example: ("arc_c", "rule") -> "choice"; ("math", "") -> "math"; ("my_quiz", "choice") -> "choice".
    """
    style = (style or "").strip().lower()
    if style in GRADERS:
        return style
    return "choice" if source in CHOICE_SOURCES else "math"


def _read_label(text: str, pos: int, digits: bool) -> tuple[str, int] | None:
    """(label, end) of a choice written at `pos` ("**(C)**", "option B", "c" ending its line), else None.

    Skips markup and at most one line break first. No label: a letter inside a word ("Apparently"),
    a lowercase letter that can be an article ("a mixture"), the pronoun "I think", "25", "2.5".
    """
    n, newline = len(text), False
    while pos < n and (text[pos] in _LEAD or (text[pos] == "\n" and not newline)):
        newline |= text[pos] == "\n"
        pos += 1
    if word := _WORD.match(text, pos):
        pos = word.end()
    opened = pos < n and text[pos] in "(["
    pos += opened
    while pos < n and text[pos] in " \t":
        pos += 1
    if pos >= n or not (text[pos].isdigit() if digits else text[pos] in "ABCDEFGHIJabcdefghij") or text[pos] == "0":
        return None
    label, after = text[pos], pos + 1
    if text[after:after + 1].isalnum() or (digits and _DECIMAL.match(text, after)):
        return None
    end = after
    while end < n and text[end] in " \t":
        end += 1
    closed = end < n and text[end] in ")]"
    end = end + 1 if closed else after
    if label.islower() and not (opened and closed) and not _TAIL_ONLY.match(text, after):
        return None
    if label == "I" and not closed and _PRONOUN.match(text, after):
        return None
    return label.upper(), end


def _labels_at(text: str, pos: int, digits: bool) -> list[str]:
    """The labels announced from `pos`: one, or several joined by "," "/" "&" "or" "and" (then ambiguous)."""
    labels: list[str] = []
    while read := _read_label(text, pos, digits):
        labels.append(read[0])
        sep = _SEP.match(text, read[1])
        if sep is None:
            break
        pos = sep.end()
    return labels


def _announcements(text: str, digits: bool) -> list[tuple[int, set[str]]]:
    """(position, labels) of every announced choice, in text order."""
    found = []
    for cue in _CUE.finditer(text):
        if labels := _labels_at(text, cue.end(), digits):
            found.append((cue.start(), set(labels)))
    for box in _BOX.finditer(text):
        inside = _BOX_CONTENT.match(text, box.end(), box.end() + _BOX_CHARS)
        if inside is None:
            continue
        content = _MARKUP.sub(r"\1", inside.group(1)).strip()
        if not digits and re.fullmatch(r"[A-J]{2,}", content):
            found.append((box.start(), set(content)))  # \boxed{AC}
        elif labels := _labels_at(content, 0, digits):
            found.append((box.start(), set(labels)))
    for verdict in _VERDICT.finditer(text):
        if verdict.group(1).isdigit() == digits:
            found.append((verdict.start(), {verdict.group(1).upper()}))
    return sorted(found, key=lambda f: f[0])


def extract_choice(text: str, digits: bool = False) -> tuple[str | None, str]:
    """The response's final choice: (label, "ok"), or (None, "ambiguous") / (None, "no_answer").

    The last announcement decides ("ANSWER: C", "\\boxed{C}", "the answer is (C)", "Option C is correct"),
    so a corrected answer counts; it is ambiguous when it names two labels ("A or B", "\\boxed{A, C}")
    or its line announces another ("\\boxed{A} or \\boxed{B}"). With no announcement, a last line
    holding only a label ("C", "(C).", "**C**") counts. Letters A-J in either case (lowercase only where
    it cannot be an article: "(c)", "answer: c" ending its line); digits 1-9 instead when `digits`
    (ARC-c's questions with options labelled 1-4).
    """
    found = _announcements(text, digits)
    if found:
        last = found[-1][0]
        line_start = text.rfind("\n", 0, last) + 1
        line_end = text.find("\n", last) % (len(text) + 1)  # -1 (no newline) -> len(text)
        labels = set().union(*(ls for pos, ls in found if line_start <= pos <= line_end))
        return (labels.pop(), "ok") if len(labels) == 1 else (None, "ambiguous")
    last_line = text.rstrip().rsplit("\n", 1)[-1].strip().strip("*_#>`$ ")
    bare = re.fullmatch(r"\(?([A-Ja-j]|[1-9])\)?\.?", last_line)
    if bare and bare.group(1).isdigit() == digits:
        return bare.group(1).upper(), "ok"
    return None, "no_answer"


def grade_choice(response: str, answer: str, *, require_think: bool = False) -> tuple[float, str]:
    """Multiple-choice reward: 1.0 when the final choice (`extract_choice`) is the gold label, else 0.0.

    Args:
        response: the model's text (never executed; regular expressions only).
        answer: the gold label, "C" (or "(C)", "c"), or a digit for questions labelled 1-4.
        require_think: as `grade`: demand a `<think>...</think>` block and read only what follows it.

    Returns:
        (reward, reason), reason in "correct", "wrong", "no_answer", "ambiguous", "no_think", "error"
        (the gold is no label: a data problem).
    """
    gold = answer.strip().strip("()[]. ").upper()
    if not re.fullmatch(r"[A-Z]|[1-9]", gold):
        return 0.0, "error"
    if require_think:
        think = _THINK.search(response)
        if think is None:
            return 0.0, "no_think"
        response = response[think.end():]
    choice, how = extract_choice(response, digits=gold.isdigit())
    if choice is None:
        return 0.0, how
    return (1.0, "correct") if choice == gold else (0.0, "wrong")


def grade_rows(verify, responses: list[str], answers: list[str], graders: list[str], *,
               require_think: bool = False) -> list[tuple[float, str]]:
    """Grade each response with its row's grader: "choice" rows here, the others in one `verify` call.

    Args:
        verify: the math verifier, `(responses, answers) -> [(reward, reason)]` (e.g. MathVerifier.verify).
        graders: per row, "math" or "choice" (`grader_for`).
        require_think: for the choice rows (the math verifier carries its own setting).
    """
    if not len(responses) == len(answers) == len(graders):
        raise ValueError(f"grade_rows got {len(responses)} responses, {len(answers)} answers, {len(graders)} graders")
    unknown = set(graders) - set(GRADERS)
    if unknown:
        raise ValueError(f"unknown graders {sorted(unknown)}; use one of {GRADERS}")
    out: list[tuple[float, str] | None] = [None] * len(responses)
    math_rows = [i for i, g in enumerate(graders) if g == "math"]
    for i, g in enumerate(graders):
        if g == "choice":
            out[i] = grade_choice(responses[i], answers[i], require_think=require_think)
    if math_rows:
        graded = verify([responses[i] for i in math_rows], [answers[i] for i in math_rows])
        for i, result in zip(math_rows, graded):
            out[i] = result
    return out  # type: ignore[return-value]
