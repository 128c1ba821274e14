"""The image build context (Docker cannot run here) keeps every secret out: .dockerignore and
infra/Dockerfile.dockerignore, read with Docker's own pattern rules, exclude .env and its variants, run
folders, databases and venvs anywhere, and keep every file infra/Dockerfile copies."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IGNORE_FILES = [ROOT / ".dockerignore", ROOT / "infra" / "Dockerfile.dockerignore"]


def _regex(pattern: str) -> re.Pattern:
    """Docker's pattern (moby/patternmatcher) as a regex: `*` and `?` stay inside one path segment,
    `**/` is any number of leading folders (none included), another `**` anything."""
    out, i = "", 0
    while i < len(pattern):
        ch = pattern[i]
        if pattern.startswith("**/", i):
            out, i = out + "(.*/)?", i + 3
            continue
        if pattern.startswith("**", i):
            out, i = out + ".*", i + 2
            continue
        if ch == "*":
            out += "[^/]*"
        elif ch == "?":
            out += "[^/]"
        elif ch == "\\" and i + 1 < len(pattern):
            i += 1
            out += re.escape(pattern[i])
        elif ch == "[":
            end = pattern.index("]", i)
            out += pattern[i:end + 1]
            i = end
        else:
            out += re.escape(ch)
        i += 1
    return re.compile(f"^{out}$")


def _patterns(source: Path | str) -> list[tuple[bool, re.Pattern, int]]:
    """(is an exception `!`, regex, number of path segments) per pattern line of a file (or text), in order."""
    out = []
    for line in (source.read_text() if isinstance(source, Path) else source).splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        line = line[1:].strip() if negated else line
        line = re.sub(r"/+", "/", line).strip("/") or "."
        out.append((negated, _regex(line), len(line.split("/"))))
    return out


def _matches(patterns, path: str) -> bool:
    """Docker's MatchesOrParentMatches: the last pattern matching the path, or its leading folders cut to
    the pattern's own depth, decides."""
    excluded, parts = False, path.split("/")
    for negated, rx, depth in patterns:
        if rx.match(path) or (depth < len(parts) and rx.match("/".join(parts[:depth]))):
            excluded = not negated
    return excluded


def excluded(patterns, path: str) -> bool:
    """Left out of the context: the file, or a folder above it (the build does not walk into one; true
    here, where no exception `!` names anything inside an excluded folder)."""
    parts = path.split("/")
    return any(_matches(patterns, "/".join(parts[:n])) for n in range(1, len(parts) + 1))


def test_the_matcher_follows_dockers_rules():
    p = _patterns("*.db\n**/runs\ndocs/**\n")
    assert excluded(p, "a.db") and not excluded(p, "sub/a.db")  # no implicit **/, unlike .gitignore
    assert excluded(p, "runs/x") and excluded(p, "a/b/runs/c/d")
    assert excluded(p, "docs/x/y") and not excluded(p, "docs") and not excluded(p, "runsx/a")
    p = _patterns("*\n!flows\n**/.env\n")  # the ignore files' shape: all out, some folders back, then never
    assert not excluded(p, "flows/a/b.py") and excluded(p, "flows/a/.env") and excluded(p, "docs/a.md")


def test_both_ignore_files_hold_the_same_rules():
    # BuildKit reads infra/Dockerfile.dockerignore for infra/Dockerfile, the classic builder the root file
    rules = [[line for line in f.read_text().splitlines() if line.strip() and not line.startswith("#")]
             for f in IGNORE_FILES]
    assert rules[0] == rules[1]


@pytest.mark.parametrize("ignore", IGNORE_FILES, ids=lambda p: p.name)
@pytest.mark.parametrize("path", [
    ".env", ".env.local", ".env.production", "infra/.env", "flows/.env.local", "prod.env", "runs/exgrpo/ckpt.pt",
    "flows/runs/x.json", "mlruns/0/meta.yaml", "exp.db", "exgrpo_core/data/exp.db", "mlflow.db-wal",
    "configs/cache.sqlite3", ".venv/bin/python", ".venv-vllm/lib/x.py", "exgrpo_core/__pycache__/x.pyc",
    ".git/config", "tests/conftest.py", "benchmarks/results.md", "docs/services.md", "pgpass",
])
def test_secrets_runs_databases_and_venvs_are_left_out(ignore, path):
    assert excluded(_patterns(ignore), path), f"{ignore.name} lets {path} into the image"


def _copied() -> tuple[list[str], list[str]]:
    """infra/Dockerfile's COPY sources, and every tracked file under them."""
    sources = []
    for line in (ROOT / "infra" / "Dockerfile").read_text().splitlines():
        if line.startswith(("COPY", "ADD")):
            sources += line.split()[1:-1]
    assert sources and "." not in [s.rstrip("/") for s in sources], "the Dockerfile copies the whole context"
    tracked = subprocess.run(["git", "ls-files", "--", *sources], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    return sources, tracked


@pytest.mark.parametrize("ignore", IGNORE_FILES, ids=lambda p: p.name)
def test_everything_the_image_copies_is_in_the_context(ignore):
    sources, tracked = _copied()
    assert {"pyproject.toml", "README.md", "prefect.yaml", "scripts/setup.sh", "infra/services.sh",
            "configs/tiny.yaml", "flows/train.py", "dashboard/app.py"} <= set(tracked)
    for source in sources:
        assert any(t == source.rstrip("/") or t.startswith(source) for t in tracked), f"{source} holds nothing"
    left_out = [t for t in tracked if excluded(_patterns(ignore), t)]
    assert not left_out, left_out


def test_git_ignores_env_files():
    for name in (".env", ".env.local"):
        out = subprocess.run(["git", "check-ignore", "-q", name], cwd=ROOT)
        assert out.returncode == 0, f"{name} is not in .gitignore"
