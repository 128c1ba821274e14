"""Stored text as inert, escaped HTML: a response with its answer span (as the verifier sees it)
highlighted, and a question or answer shown as plain text.

The span is the one `exgrpo_core.reward.grading.extract_final_answer` grades: the last non-empty
`\\boxed{...}`, else the last number. It is located again in the text (last occurrence), so a
thousands separator the extractor dropped ("1,234" -> "1234") still highlights the written form.
"""

from __future__ import annotations

import html
import re

from exgrpo_core.reward.grading import extract_final_answer


def answer_span(text: str) -> tuple[int, int] | None:
    """(start, end) of the graded answer in `text`, or None when there is none.

    Example: "so 2+3 = \\boxed{5}." -> (16, 17); "1,234 apples" -> (0, 5); "hello" -> None.
    """
    answer = extract_final_answer(text)
    if answer is None:
        return None
    start = text.rfind(answer)
    if start >= 0:
        return start, start + len(answer)
    # the extractor normalised the number (thousands separators): match it with optional commas
    pattern = ",?".join(re.escape(ch) for ch in answer)
    matches = list(re.finditer(pattern, text))
    return (matches[-1].start(), matches[-1].end()) if matches else None


def highlight_answer(text: str, correct: bool) -> str:
    """HTML of `text` (escaped, whitespace kept) with its answer span in a green or red <mark>."""
    span = answer_span(text)
    colour = "#b7ebc6" if correct else "#f7c5c5"
    if span is None:
        body = html.escape(text) + ' <em style="color:#888">(no answer found)</em>'
    else:
        a, b = span
        body = (html.escape(text[:a]) + f'<mark style="background:{colour}" title="graded answer">'
                + html.escape(text[a:b]) + "</mark>" + html.escape(text[b:]))
    return f'<div style="white-space:pre-wrap;font-family:monospace">{body}</div>'


def plain_html(label: str, text: str, monospace: bool = False) -> str:
    """HTML showing stored `text` as the characters it is, after a bold `label`: escaped, so Markdown or
    HTML in a question or answer (an image, a link) is shown, never rendered or fetched."""
    font = "font-family:monospace;" if monospace else ""
    return (f'<div style="white-space:pre-wrap"><b>{html.escape(label)}</b> '
            f'<span style="{font}">{html.escape(text)}</span></div>')
