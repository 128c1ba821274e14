"""The `paper` preset evaluates on a shipped suite, and the docs stand on their own."""

from __future__ import annotations

import re
from pathlib import Path

from exgrpo_core.config_io import load_config
from exgrpo_core.evaluation.evaluate import resolve_suite

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "implementation_details.md"


def test_paper_evaluates_on_a_suite_shipped_in_the_repository():
    cfg = load_config("paper")
    path = Path(resolve_suite(cfg.data.eval_path)).resolve()
    assert path.is_file() and ROOT in path.parents
    assert all(Path(resolve_suite(s)).resolve().is_file() for s in cfg.eval.suites)


def test_docs_stand_on_their_own():
    """No citation of a specification or data outside the repository."""
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "configs").glob("*.yaml"))]
    bad = [f"{p.relative_to(ROOT)}:{i}" for p in docs for i, line in enumerate(p.read_text().splitlines(), 1)
           if re.search(r"\bSPEC\b|SPEC\.md|\.\./shared", line)]
    assert not bad, bad
