"""End to end in a real browser: `exgrpo dashboard` on a free localhost port, driven by headless Debian
chromium through selenium; every page must show its content, two runs overlay on Buffer and Entropy, and
the drawn violins stay inside their bucket's entropy range. Screenshots are kept as test artifacts
(EXGRPO_TEST_ARTIFACTS, default tests/artifacts/). Fails, never skips, when chromium is missing."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.browser, pytest.mark.slow]
# y-axis tick labels (value, pixel centre) of the violin chart, and every violin band's label and pixel top/bottom
VIOLINS_JS = """
const out = {ticks: [], bands: []};
for (const ax of document.querySelectorAll('.vega-embed g[aria-label^="Y-axis titled \\'trajectory entropy"]')) {
  for (const t of ax.querySelectorAll('g.role-axis-label text')) {
    const r = t.getBoundingClientRect(), v = parseFloat(t.textContent);
    if (!isNaN(v)) out.ticks.push([v, r.top + r.height / 2]);
  }
}
for (const p of document.querySelectorAll('.vega-embed [aria-label^="violin "]')) {
  const r = p.getBoundingClientRect();
  out.bands.push([p.getAttribute('aria-label'), r.top, r.bottom]);
}
return out;
"""
STROKE_PX = 1.5  # a band's outline and anti-aliasing may reach this far past its data


def _screenshots_module():
    path = ROOT / "scripts" / "dashboard_screenshots.py"
    spec = importlib.util.spec_from_file_location("dashboard_screenshots", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _artifacts() -> Path:
    return Path(os.environ.get("EXGRPO_TEST_ARTIFACTS", ROOT / "tests" / "artifacts")) / "dashboard"


def test_every_page_renders_in_chromium(trained, tmp_path):
    shots = _screenshots_module()
    artifacts = _artifacts()
    port = shots.free_port()
    proc = shots.start_dashboard(trained.db_url, trained.mlflow_uri, port, tmp_path / "dashboard.log")
    try:
        texts = shots.capture_all(f"http://127.0.0.1:{port}", trained.ids["exgrpo"], artifacts)
    finally:
        shots.stop(proc)
    for page in shots.PAGES:
        png = artifacts / f"dashboard-{page}.png"
        assert png.stat().st_size > 20_000, f"{png} looks blank"
        for bad in ("Traceback", "Error", "Page not found"):
            assert bad not in texts[page], texts[page][:2000]
    rolled_out = trained.one("select count(*) from question_states where run_id=:r and n_groups > 0",
                             r=trained.ids["exgrpo"])
    assert "exgrpo" in texts["runs"] and "on-policy" in texts["runs"]
    assert f"{rolled_out} questions match" in texts["experience"]
    assert "tiny-arith" in texts["results"]
    start = trained.one("select replay_started_step from runs where name='exgrpo'")
    assert f"replay on since step\n{start + 1}" in texts["buffer"]  # stored 0-based, shown as its step number


def drawn_violins(driver) -> dict[str, tuple[float, float]]:
    """{violin label: (lowest, highest) entropy drawn}, read off the page's SVG through the y axis."""
    found = driver.execute_script(VIOLINS_JS)
    ticks = np.array(sorted(found["ticks"]))[1:-1]  # the end labels are shifted inwards to stay in the plot
    assert len(ticks) >= 2, found
    slope, intercept = np.polyfit(ticks[:, 1], ticks[:, 0], 1)  # pixel row -> nats
    assert slope < 0  # entropy grows upwards
    spans: dict[str, tuple[float, float]] = {}
    for label, top, bottom in found["bands"]:
        lo, hi = slope * bottom + intercept, slope * top + intercept
        old = spans.get(label, (lo, hi))
        spans[label] = (min(lo, old[0]), max(hi, old[1]))
    return spans, abs(slope) * STROKE_PX


def test_two_runs_overlay_and_violins_stay_inside_their_buckets(trained, tmp_path):
    shots = _screenshots_module()
    ids, names = trained.ids, {rid: f"{name} ({rid[:8]})" for name, rid in trained.ids.items()}
    overlay = f"{ids['exgrpo']},{ids['on-policy']}"
    port = shots.free_port()
    proc = shots.start_dashboard(trained.db_url, trained.mlflow_uri, port, tmp_path / "dashboard.log")
    driver = shots.chromium()
    try:
        base = f"http://127.0.0.1:{port}"
        buffer = shots.open_page(driver, base, "buffer", None, query=f"overlay={overlay}")
        shots.screenshot(driver, _artifacts() / "dashboard-buffer-cross-run.png")
        entropy = shots.open_page(driver, base, "entropy", None, query=f"overlay={overlay}")
        spans, tol = drawn_violins(driver)
        shots.screenshot(driver, _artifacts() / "dashboard-entropy-cross-run.png")
    finally:
        driver.quit()
        shots.stop(proc)
    for text in (buffer, entropy):
        assert all(n in text for n in names.values()), text[:2000]
    assert buffer.count("replay on since step") == 2 and "replays per source bucket" in buffer
    expected = {}
    for rid in ids.values():
        for k, lo, hi in trained.sql(
                "select g.k, min(t.entropy), max(t.entropy) from trajectories t join group_results g on "
                "g.run_id=t.run_id and g.question_id=t.question_id and g.step=t.collected_step where t.run_id=:r "
                "and t.entropy is not null group by g.k", r=rid):
            expected[f"violin {k} | {names[rid]}"] = (lo, hi)
    assert set(spans) == set(expected)
    for label, (lo, hi) in expected.items():
        drawn = spans[label]
        assert lo - tol <= drawn[0] <= drawn[1] <= hi + tol, (label, drawn, (lo, hi), tol)
        assert drawn[0] <= lo + tol and drawn[1] >= hi - tol, (label, drawn, (lo, hi))  # and reaches both ends
