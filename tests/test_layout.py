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
