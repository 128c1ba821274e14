"""End to end in a real browser: `exgrpo dashboard` on a free localhost port, driven by headless Debian
chromium through selenium; every page must show its content. Screenshots are kept as test artifacts
(EXGRPO_TEST_ARTIFACTS, default tests/artifacts/). Fails, never skips, when chromium is missing."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _screenshots_module():
    path = ROOT / "scripts" / "dashboard_screenshots.py"
    spec = importlib.util.spec_from_file_location("dashboard_screenshots", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_page_renders_in_chromium(trained, tmp_path):
    shots = _screenshots_module()
    artifacts = Path(os.environ.get("EXGRPO_TEST_ARTIFACTS", ROOT / "tests" / "artifacts")) / "dashboard"
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
    total = trained.one("select count(*) from question_states where run_id=:r", r=trained.ids["exgrpo"])
    assert "exgrpo" in texts["runs"] and "on-policy" in texts["runs"]
    assert f"{total} questions match" in texts["experience"]
    assert "tiny-arith" in texts["results"]
    start = trained.one("select replay_started_step from runs where name='exgrpo'")
    assert f"replay on since step\n{start}" in texts["buffer"]
