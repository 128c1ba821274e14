"""User-facing text names no issue-tracker numbers ("issue 12", "issues 3 and 4", "(#12)"): a reader
outside the tracker cannot follow them. Say what the work was about, or link the doc, instead."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ISSUE_WORD = re.compile(r"\bissues?\s*#?\d+", re.I)  # issue 12, Issue #12, issues 3 and 4, issue35
HASH_NUMBER = re.compile(r"(?<![\w&/#])#\d+\b")  # #12, (#12); not &#39; entities, not a/#1 in paths
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
URL = re.compile(r"<?https?://[^\s)>\]]+>?")
LINK_TARGET = re.compile(r"\]\([^)\s]*\)")
PARENTHESISED_HASH = re.compile(r"\(#\d+\)")


def _prose(text: str) -> str:
    """Markdown or YAML with code blocks, code spans, URLs and link targets removed."""
    for pattern in (FENCE, CODE_SPAN, URL, LINK_TARGET):
        text = pattern.sub(" ", text)
    return text


def issue_references(text: str, python: bool = False) -> list[str]:
    """The issue numbers a text names. In Python source (whose strings may hold colours such as "#444")
    only the word "issue" with a number and a parenthesised "(#12)" count."""
    if python:
        return ISSUE_WORD.findall(text) + PARENTHESISED_HASH.findall(text)
    prose = _prose(text)
    return ISSUE_WORD.findall(prose) + HASH_NUMBER.findall(ISSUE_WORD.sub(" ", prose))


def user_facing_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "benchmarks" / "README.md"]
    files += sorted((ROOT / "docs").rglob("*.md"))
    files += sorted((ROOT / "configs").glob("*.yaml"))
    files += sorted((ROOT / "dashboard").rglob("*.py"))
    return files


def test_user_facing_text_names_no_issue_numbers():
    files = user_facing_files()
    assert len(files) > 15
    bad = {}
    for path in files:
        found = issue_references(path.read_text(), python=path.suffix == ".py")
        if found:
            bad[str(path.relative_to(ROOT))] = found
    assert not bad, f"issue numbers in user-facing text (say what it was about instead): {bad}"


def test_the_check_finds_issue_numbers_and_ignores_headings_colours_and_code():
    found = ["issue 12", "Issue #7", "issues 3", "#12", "#40"]  # "4" of "issues 3 and 4" rides on "issues 3"
    text = ("Fixed in issue 12. See Issue #7, and issues 3 and 4 (#12). Also #40 here.\n"
            "## 2. A heading\n# Title\n`color: #444` and `git show #5` in code, "
            "[a link](https://example.com/pull/9#33), [anchor](#section-2), &#39; an entity, runs/#1.\n"
            "```\nissue 99 inside a fence, #77\n```\n")
    assert issue_references(text) == found
    py = 'COLOR = "#888"  # a comment\n"""Streamlit dashboard (issue 3)."""\nlabel = "fixed (#14)"\n'
    assert issue_references(py, python=True) == ["issue 3", "(#14)"]
