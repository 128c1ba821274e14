"""dashboard/highlight.py: the highlighted span is the answer the verifier grades, and the HTML is escaped."""

import pytest

from dashboard.highlight import answer_span, highlight_answer


@pytest.mark.parametrize("text, span", [
    ("so 2+3 = \\boxed{5}.", "5"),
    ("first \\boxed{3} then \\boxed{4}", "4"),
    ("2 + 3 = 5, not 6", "6"),
    ("1,234 apples", "1,234"),
    ("x = \\frac{1}{2}", "\\frac{1}{2}"),
])
def test_answer_span_is_the_graded_answer(text, span):
    a, b = answer_span(text)
    assert text[a:b] == span


def test_no_answer_gives_no_span():
    assert answer_span("hello") is None
    assert "no answer found" in highlight_answer("hello", False)


def test_html_is_escaped_and_the_answer_marked():
    out = highlight_answer("<script>x</script> = \\boxed{7}", True)
    assert "<script>" not in out and "&lt;script&gt;" in out
    assert '<mark style="background:#b7ebc6" title="graded answer">7</mark>' in out
    assert "#f7c5c5" in highlight_answer("= 7", False)
