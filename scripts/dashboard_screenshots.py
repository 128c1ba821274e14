"""Screenshots of every dashboard page, taken in headless chromium: docs/img/dashboard-<page>.png, and
the Buffer and Entropy pages with two runs overlaid: docs/img/dashboard_<page>_cross_run.png.

    python scripts/dashboard_screenshots.py                      # trains two tiny runs first (about 2 min)
    python scripts/dashboard_screenshots.py --db-url URL --mlflow-uri URI --run RUN_ID --out docs/img \
        [--overlay RUN_ID,RUN_ID]                                # default: the two newest runs

The helpers here (start `exgrpo dashboard`, drive chromium through selenium, wait for a page's
content, save a full-page PNG) are also what tests/dashboard/test_browser.py uses.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
# url path -> texts that must be on the page once it has drawn
PAGES = {
    "runs": ["Runs", "fresh pass@1", "Select runs"],
    "buffer": ["Buffer", "pool questions", "Correctness buckets", "Question selection", "Importance weights"],
    "entropy": ["Entropy", "Correct vs incorrect", "Fresh vs replayed", "By bucket"],
    "experience": ["Experience browser", "questions match", "stored trajectories"],
    "results": ["Results", "Benchmarks", "Training curves", "MLflow runs side by side", "Final logged value"],
}
DEFAULT_PAGE = "runs"
MULTI_RUN_PAGES = {"runs", "results"}  # opened without ?run=, so they show every run (up to four)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_dashboard(db_url: str, mlflow_uri: str, port: int, log_path: Path) -> subprocess.Popen:
    """`exgrpo dashboard` as a subprocess; returns once it answers its health check."""
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "dashboard", "--db-url", db_url,
                             "--mlflow-uri", mlflow_uri, "--port", str(port)], cwd=ROOT,
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exgrpo dashboard exited with {proc.returncode}: {log_path.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"exgrpo dashboard did not answer within 120 s: {log_path.read_text()[-2000:]}")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


def chromium(width: int = 1400, height: int = 1000):
    """Headless Debian chromium through /usr/bin/chromedriver (FileNotFoundError if either is missing)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).exists():
            raise FileNotFoundError(f"{path} is missing: install Debian's chromium and chromium-driver")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={width},{height}", "--hide-scrollbars", "--force-device-scale-factor=1"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)


def page_text(driver) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.TAG_NAME, "body").text


def open_page(driver, base_url: str, page: str, run_id: str | None, timeout: float = 90, query: str = "") -> str:
    """Load a page (`?run=run_id`, or the given query string), wait until the script finished and every
    expected text is shown; returns the text."""
    from selenium.webdriver.common.by import By

    path = "" if page == DEFAULT_PAGE else page  # the default page lives at the root URL
    driver.get(f"{base_url}/{path}" + (f"?{query}" if query else f"?run={run_id}" if run_id else ""))
    deadline, text = time.time() + timeout, ""
    while time.time() < deadline:
        time.sleep(1)
        running = driver.find_elements(By.CSS_SELECTOR, '[data-testid="stStatusWidget"], [data-testid="stSpinner"]')
        text = page_text(driver)
        if "Page not found" in text:
            raise AssertionError(f"{page}: Streamlit says the page does not exist")
        if not running and "loading..." not in text and all(t in text for t in PAGES[page]):
            charts = driver.find_elements(By.CSS_SELECTOR, ".vega-embed")
            drawn = driver.find_elements(By.CSS_SELECTOR, ".vega-embed svg, .vega-embed canvas")
            if len(drawn) >= len(charts):
                time.sleep(1)  # let the last chart finish its layout
                return page_text(driver)
    missing = [t for t in PAGES[page] if t not in text]
    raise TimeoutError(f"page {page} did not show {missing} within {timeout} s; it shows: {text[:1500]}")


def screenshot(driver, path: Path, max_height: int = 4200) -> None:
    """Full-page PNG: the window is resized to the height of Streamlit's scrolling main area."""
    height = driver.execute_script(
        "const m = document.querySelector('[data-testid=\"stMain\"]') || document.body;"
        "return Math.max(m.scrollHeight, document.body.scrollHeight);")
    width = driver.get_window_size()["width"]
    driver.set_window_size(width, min(max_height, int(height) + 120))
    time.sleep(1)
    path.parent.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(path))


def capture_all(base_url: str, run_id: str | None, out_dir: Path, prefix: str = "dashboard-") -> dict[str, str]:
    """Open every page in chromium and save `<prefix><page>.png`; returns each page's text."""
    driver, texts = chromium(), {}
    try:
        for page in PAGES:
            driver.set_window_size(1400, 1000)
            texts[page] = open_page(driver, base_url, page, None if page in MULTI_RUN_PAGES else run_id)
            screenshot(driver, out_dir / f"{prefix}{page}.png")
    finally:
        driver.quit()
    return texts


def capture_cross_run(base_url: str, run_ids: list[str], out_dir: Path) -> dict[str, str]:
    """Buffer and Entropy with the runs overlaid: `dashboard_<page>_cross_run.png`; returns each page's text."""
    driver, texts = chromium(), {}
    try:
        for page in ("buffer", "entropy"):
            driver.set_window_size(1400, 1000)
            texts[page] = open_page(driver, base_url, page, None, query=f"overlay={','.join(run_ids)}")
            screenshot(driver, out_dir / f"dashboard_{page}_cross_run.png")
    finally:
        driver.quit()
    return texts


def _newest_two(db_url: str) -> list[str]:
    import sqlalchemy as sa

    engine = sa.create_engine(db_url)
    try:
        with engine.connect() as conn:
            return [r for (r,) in conn.execute(sa.text("select id from runs order by created_at desc limit 2"))]
    finally:
        engine.dispose()


def train_demo_runs(folder: Path) -> tuple[str, str]:
    """Two tiny runs (ExGRPO with a final evaluation, and on-policy) into one database and MLflow store."""
    db, mlflow = f"sqlite:///{folder / 'exp.db'}", f"sqlite:///{folder / 'mlflow.db'}"
    base = ["--config", "configs/tiny.yaml", "--set", f"run.output_dir={folder / 'runs'}", "--set", f"run.db_url={db}",
            "--set", f"run.mlflow_tracking_uri={mlflow}", "--set", "run.steps=12", "--set", "eval.every=4",
            "--set", "eval.final=true", "--set", 'eval.suites=["bundled:tiny-arith"]']
    for name, extra in (("on-policy", ["--set", "buffer.replay_ratio=0"]), ("exgrpo", [])):
        subprocess.run([sys.executable, "-m", "flows.cli", "train", *base, "--set", f"run.name={name}", *extra],
                       cwd=ROOT, check=True)
    return db, mlflow


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db-url")
    ap.add_argument("--mlflow-uri")
    ap.add_argument("--run", default=None, help="run id shown on single-run pages (default: the newest)")
    ap.add_argument("--overlay", default=None, help="comma-separated run ids for the cross-run pictures "
                    "(default: the two newest runs)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "img"))
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="exgrpo-shots-"))
    db, mlflow = (args.db_url, args.mlflow_uri) if args.db_url else train_demo_runs(folder)
    port = free_port()
    proc = start_dashboard(db, mlflow or f"sqlite:///{folder / 'mlflow.db'}", port, folder / "dashboard.log")
    try:
        capture_all(f"http://127.0.0.1:{port}", args.run, Path(args.out))
        overlay = args.overlay.split(",") if args.overlay else _newest_two(db)
        capture_cross_run(f"http://127.0.0.1:{port}", overlay, Path(args.out))
    finally:
        stop(proc)
    print(f"wrote {', '.join(f'dashboard-{p}.png' for p in PAGES)} and dashboard_buffer_cross_run.png, "
          f"dashboard_entropy_cross_run.png to {args.out}")


if __name__ == "__main__":
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    main()
