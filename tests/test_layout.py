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
# What each subpackage may import from the rest of exgrpo_core (the run's modules at the top compose them).
ALLOWED = {
    "algorithm": {"metrics", "types", "config", "algorithm"},
    "store": {"metrics", "types", "config", "algorithm", "store"},
    "rollout": {"metrics", "types", "config", "models", "rollout", "training"},
    "training": {"metrics", "types", "config", "checkpoint", "algorithm", "rollout", "training"},
    "evaluation": {"metrics", "types", "config", "data", "rewards", "rollout", "evaluation"},
}


def _imported(text: str) -> set[str]:
    found = set()
    for pkg, _sub, names in CORE_IMPORT.findall(text):
        if pkg:
            found.add(pkg)
        else:  # from exgrpo_core import a, b as c
            found |= {n.split(" as ")[0].strip() for n in names.split(",")}
    return found


def test_subpackages_import_only_their_layer():
    bad = []
    for pkg, allowed in ALLOWED.items():
        for p in (ROOT / "exgrpo_core" / pkg).rglob("*.py"):
            extra = _imported(p.read_text()) - allowed
            if extra:
                bad.append(f"{p.relative_to(ROOT)} imports {sorted(extra)}")
    assert not bad, f"layering broken: {bad}"


def test_the_layer_check_sees_a_forbidden_import():
    assert _imported("from exgrpo_core import loop, metrics as M\nfrom exgrpo_core.session import x\n") == {
        "loop", "metrics", "session"}
