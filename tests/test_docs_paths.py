"""Every file or folder a Markdown page names exists: repository paths in the text and relative links."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOP = "exgrpo_core|flows|dashboard|tests|scripts|benchmarks|configs|docs|infra"
REPO_PATH = re.compile(rf"(?<![\w/.-])((?:{TOP})/[\w./*-]*\w)")
LINK = re.compile(r"\]\((?!https?://|mailto:|#)([^)\s]+)\)")


def _exists(path: Path) -> bool:
    """The path, a glob match of it or (for prefixes such as `step_*`) a name starting with it; a path
    git ignores (a folder a script creates, such as a virtual environment) counts as named on purpose."""
    if path.exists() or any(path.parent.glob(path.name)) or any(path.parent.glob(path.name + "*")):
        return True
    try:
        rel = str(path.resolve().relative_to(ROOT))
    except ValueError:
        return False
    return any(subprocess.run(["git", "check-ignore", "-q", name], cwd=ROOT).returncode == 0 for name in (rel, rel + "/"))


def broken_references(md: Path, text: str, root: Path = ROOT) -> list[str]:
    prose = LINK.sub("]()", text)  # link targets are relative to the page, checked below
    bad = [m.group(1) for m in REPO_PATH.finditer(prose) if not _exists(root / m.group(1).split(":")[0])]
    bad += [m.group(1) for m in LINK.finditer(text) if not _exists(md.parent / m.group(1).split("#")[0])]
    return bad


def test_markdown_names_only_paths_that_exist():
    pages = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    pages = [p for p in pages if not p.startswith("benchmarks/results/")]  # records of past commands, kept as run
    assert len(pages) > 10
    bad = {p: b for p in pages if (b := broken_references(ROOT / p, (ROOT / p).read_text()))}
    assert not bad, f"pages name paths that do not exist: {bad}"


def test_the_check_sees_a_moved_file(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "train.py").write_text("")
    page = tmp_path / "docs" / "a.md"
    text = ("see flows/train.py:train and flows/compare.py, [x](../flows/train.py), [y](gone.md) and "
            "[z](flows/train.py)")
    assert broken_references(page, text, tmp_path) == ["flows/compare.py", "gone.md", "flows/train.py"]
