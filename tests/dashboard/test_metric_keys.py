"""Every metric key the dashboard charts is part of the metrics contract (STYLE P9)."""

import re
from pathlib import Path

from exgrpo_core import metrics as M

DASHBOARD = Path(__file__).resolve().parents[2] / "dashboard"
LITERAL = re.compile(r"""["']((?:rollout|verify|buffer|select|loss|perf|eval)/[\w@/.-]*)["']""")
ATTRIBUTE = re.compile(r"\bM\.([A-Z][A-Z0-9_]*)\b")


def test_dashboard_refers_only_to_declared_metric_keys():
    literals, attributes = set(), set()
    for path in DASHBOARD.rglob("*.py"):
        source = path.read_text()
        literals |= set(LITERAL.findall(source))
        attributes |= set(ATTRIBUTE.findall(source))
    assert attributes, "the dashboard should name metrics through exgrpo_core.metrics"
    missing = sorted(a for a in attributes if not isinstance(getattr(M, a, None), str))
    assert not missing, f"not in exgrpo_core/metrics.py: {missing}"
    undeclared = sorted(k for k in literals if not (k == "buffer/bucket_" or M.declared(k, 8)))
    assert not undeclared, f"metric keys spelled out in the dashboard but not declared: {undeclared}"
    charted = {getattr(M, a) for a in attributes} - {M.EVAL_PREFIX}
    assert all(M.declared(k, 8) for k in charted), sorted(k for k in charted if not M.declared(k, 8))
