"""Repository rules that keep the code readable (STYLE P1, P10): one-way imports, small files."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = re.compile(r"^\s*(import|from)\s+(prefect|mlflow|streamlit)\b", re.M)


def test_core_never_imports_orchestration_tracking_or_ui():
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "exgrpo_core").rglob("*.py")
                 if FORBIDDEN.search(p.read_text())]
    assert not offenders, f"exgrpo_core must not import prefect/mlflow/streamlit: {offenders}"


def test_flows_and_dashboard_do_not_import_each_other():
    for a, b in (("flows", "dashboard"), ("dashboard", "flows")):
        pattern = re.compile(rf"^\s*(import|from)\s+{b}\b", re.M)
        offenders = [p.name for p in (ROOT / a).rglob("*.py") if pattern.search(p.read_text())]
        assert not offenders, f"{a} imports {b}: {offenders}"


def test_modules_stay_under_the_hard_size_limit():
    limits = {"exgrpo_core": 500, "flows": 500, "dashboard": 500, "tests": 400}
    too_big = []
    for folder, limit in limits.items():
        for p in (ROOT / folder).rglob("*.py"):
            n = len(p.read_text().splitlines())
            if n > limit:
                too_big.append(f"{p.relative_to(ROOT)} ({n} > {limit})")
    assert not too_big, f"split these by concept: {too_big}"


CORE_IMPORT = re.compile(r"^\s*(?:from|import)\s+exgrpo_core\.?([a-z_]*)(?:\.([a-z_]+))?(?:\s+import\s+([\w ,]+))?", re.M)
# What each subpackage may import from the rest of exgrpo_core: a whole package ("store") or one module
# of it ("run.checkpoint"). loop.py at the top composes them; flows/ composes loop and the packages.
BASE = {"metrics", "types"}
ALLOWED = {
    "config": {"config"},
    "algorithm": BASE | {"config", "algorithm"},
    "data": BASE | {"config", "data"},
    "store": BASE | {"config", "algorithm", "store"},
    "reward": BASE | {"config", "store", "run.lifeline", "reward"},
    "models": BASE | {"config", "data", "run.checkpoint", "models"},
    "rollout": BASE | {"config", "models", "run.lifeline", "rollout", "training"},
    "training": BASE | {"config", "run.checkpoint", "algorithm", "rollout", "training"},
    "evaluation": BASE | {"config", "data", "reward", "rollout", "evaluation"},
    "observe": BASE | {"config", "algorithm", "observe"},
    "run": BASE | {"config", "algorithm", "data", "store", "reward", "models", "rollout", "training", "run"},
}


def _imported(text: str) -> set[str]:
    """exgrpo_core names a file imports: "pkg" for a top-level module, "pkg.module" inside a subpackage."""
    found = set()
    for pkg, sub, names in CORE_IMPORT.findall(text):
        if pkg and sub:
            found.add(f"{pkg}.{sub}")
        elif pkg and (ROOT / "exgrpo_core" / pkg).is_dir() and names:  # from exgrpo_core.run import a, b
            found |= {f"{pkg}.{n.split(' as ')[0].strip()}" for n in names.split(",")}
        elif pkg:
            found.add(pkg)
        else:  # from exgrpo_core import a, b as c
            found |= {n.split(" as ")[0].strip() for n in names.split(",")}
    return found


def _allowed(name: str, allowed: set[str]) -> bool:
    return name in allowed or name.split(".")[0] in allowed


def test_subpackages_import_only_their_layer():
    bad = []
    for pkg, allowed in ALLOWED.items():
        for p in (ROOT / "exgrpo_core" / pkg).rglob("*.py"):
            extra = {n for n in _imported(p.read_text()) if not _allowed(n, allowed)}
            if extra:
                bad.append(f"{p.relative_to(ROOT)} imports {sorted(extra)}")
    assert not bad, f"layering broken: {bad}"


def test_every_subpackage_has_a_layer_rule():
    packages = {p.parent.name for p in (ROOT / "exgrpo_core").glob("*/__init__.py")}
    assert packages == set(ALLOWED), f"give these a rule in ALLOWED: {sorted(packages ^ set(ALLOWED))}"


def test_the_top_of_exgrpo_core_stays_short():
    modules = sorted(p.name for p in (ROOT / "exgrpo_core").glob("*.py"))
    assert len(modules) <= 8, f"put these in a subpackage by concept: {modules}"


def test_the_layer_check_sees_a_forbidden_import():
    assert _imported("from exgrpo_core import loop, metrics as M\nfrom exgrpo_core.run.session import x\n"
                     "from exgrpo_core.run import checkpoint as C\n") == {"loop", "metrics", "run.session", "run.checkpoint"}
    assert not _allowed("run.session", ALLOWED["models"]) and _allowed("run.checkpoint", ALLOWED["models"])
