"""Screenshots of a training run as Prefect and MLflow show it, taken in headless chromium:
docs/img/prefect_run_page.png (the flow run page: task runs by stage and step, step lines),
docs/img/prefect_run_artifacts.png (its summary artifact), docs/img/mlflow_experiment.png
(the experiment in MLflow's model-training view), docs/img/mlflow_run_plots.png (a run's pictures) and
infra/img/prefect-run-form.png (the exgrpo-train deployment's Run form).

    python scripts/prefect_mlflow_screenshots.py [--out docs/img]   # servers + one 4-step tiny run: minutes

It starts a Prefect server with its UI and an MLflow server (SQLite, artifacts served) in a temporary
folder, trains a tiny run against both the way a deployment run does (preset and typed fields), and
stops everything at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from dashboard_screenshots import chromium, free_port  # noqa: E402

RUN = """
import sys
from flows.train import train
state = train(preset="tiny", steps=4, seed=3, overrides=sys.argv[1:], return_state=True)
r = state.result()
print("FLOW_RUN", state.state_details.flow_run_id, r["mlflow_run_id"], r["run_dir"])
"""


def _serve(cmd: list[str], health: str, log: Path, env: dict) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    deadline = time.time() + 240
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd[2]} exited: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(health, timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(1)
    proc.kill()
    raise RuntimeError(f"{health} did not answer within 240 s")


def _shot(driver, url: str, path: Path, wait_for: str, settle: float = 4.0, close_panels: bool = False) -> str:
    """Open `url`, wait for `wait_for` in its text, optionally close side panels (MLflow's assistant), save."""
    from selenium.webdriver.common.by import By

    driver.get(url)
    deadline = time.time() + 90
    while wait_for not in driver.find_element(By.TAG_NAME, "body").text:
        if time.time() > deadline:
            driver.save_screenshot(str(path))
            raise RuntimeError(f"{url} never showed {wait_for!r} (screenshot of what it showed: {path})")
        time.sleep(1)
    time.sleep(settle)
    if close_panels:
        for button in driver.find_elements(By.CSS_SELECTOR, "button[aria-label='Close']"):
            if button.is_displayed():
                button.click()
        time.sleep(1)
    driver.save_screenshot(str(path))
    return driver.find_element(By.TAG_NAME, "body").text


def shoot_form(path: Path, prefect_ui: str) -> None:
    """The exgrpo-train deployment's Run form (a deployment on a process pool made for it)."""
    os.environ["PREFECT_API_URL"] = f"{prefect_ui}/api"
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    from flows.train import train

    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name="exgrpo-process", type="process"))
    dep_id = train.to_deployment(name="exgrpo-train", work_pool_name="exgrpo-process",
                                 parameters={"preset": "tiny"}).apply()
    driver = chromium(1600, 1250)
    try:
        _shot(driver, f"{prefect_ui}/deployments/deployment/{dep_id}/run", path, "replay_ratio")
    finally:
        driver.quit()


def shoot(out: Path, prefect_ui: str, mlflow_uri: str, flow_run_id: str, mlflow_run_id: str, run_name: str) -> None:
    """The four screenshots of one finished run (servers up)."""
    os.environ["PREFECT_API_URL"] = f"{prefect_ui}/api"
    import mlflow
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter

    exp_id = mlflow.MlflowClient(mlflow_uri).get_run(mlflow_run_id).info.experiment_id
    with get_client(sync_client=True) as client:
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id={"any_": [flow_run_id]}))
    summary = next(a for a in arts if a.type == "markdown")
    driver = chromium(1600, 1250)
    try:
        flow_run_name = run_name.split("-", 1)[1].rsplit("-", 1)[0]  # tiny-<flow run name>-<hex>
        _shot(driver, f"{prefect_ui}/runs/flow-run/{flow_run_id}", out / "prefect_run_page.png", "exgrpo.flow_steps")
        _shot(driver, f"{prefect_ui}/artifacts/artifact/{summary.id}", out / "prefect_run_artifacts.png",
              "MLflow run")
        exp = f"{mlflow_uri}/#/experiments/{exp_id}"
        _shot(driver, exp + "?workflowType=machine_learning", out / "mlflow_experiment.png", run_name,
              close_panels=True)
        _shot(driver, f"{exp}/runs/{mlflow_run_id}/artifacts/plots/step_000004/entropy.png"
              "?workflowType=machine_learning", out / "mlflow_run_plots.png", "entropy.png", close_panels=True)
    finally:
        driver.quit()
    print(f"{flow_run_name}: screenshots in {out}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "img"))
    ap.add_argument("--form", default=str(ROOT / "infra" / "img" / "prefect-run-form.png"))
    ap.add_argument("--hold", action="store_true", help="train, print the shoot() arguments and keep serving")
    args = ap.parse_args()
    out = Path(args.out)
    tmp = Path(tempfile.mkdtemp(prefix="exgrpo-shots-"))
    p_port, m_port = free_port(), free_port()
    env = {**os.environ, "PREFECT_HOME": str(tmp / "prefect"), "PREFECT_UI_ENABLED": "true",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PYTHONPATH": str(ROOT),
           "PREFECT_UI_API_URL": f"http://127.0.0.1:{p_port}/api"}  # the browser's API (default: port 4200)
    env.pop("PREFECT_API_URL", None)
    procs = [_serve([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(p_port)],
                    f"http://127.0.0.1:{p_port}/api/health", tmp / "prefect.log", env)]
    try:
        procs.append(_serve([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(m_port),
                             "--backend-store-uri", f"sqlite:///{tmp / 'mlflow.db'}",
                             "--artifacts-destination", str(tmp / "mlartifacts")],
                            f"http://127.0.0.1:{m_port}/health", tmp / "mlflow.log", env))
        mlflow_uri = f"http://127.0.0.1:{m_port}"
        run_env = {**env, "PREFECT_API_URL": f"http://127.0.0.1:{p_port}/api",
                   "PREFECT_UI_URL": f"http://127.0.0.1:{p_port}"}
        done = subprocess.run([sys.executable, "-c", RUN, f"run.output_dir={tmp / 'runs'}",
                               f"run.db_url=sqlite:///{tmp / 'exp.db'}", f"run.mlflow_tracking_uri={mlflow_uri}"],
                              cwd=ROOT, env=run_env, capture_output=True, text=True, timeout=1200)
        line = next((x for x in done.stdout.splitlines() if x.startswith("FLOW_RUN")), None)
        if line is None:
            raise RuntimeError(f"the tiny run failed: {(done.stdout + done.stderr)[-3000:]}")
        _, flow_run_id, mlflow_run_id, run_dir = line.split()
        run_name = Path(run_dir).name
        if args.hold:  # keep the servers for trying shots by hand: shoot(...) with these arguments
            print("HOLD", out, f"http://127.0.0.1:{p_port}", mlflow_uri, flow_run_id, mlflow_run_id, run_name,
                  flush=True)
            while True:
                time.sleep(60)
        shoot(out, f"http://127.0.0.1:{p_port}", mlflow_uri, flow_run_id, mlflow_run_id, run_name)
        shoot_form(Path(args.form), f"http://127.0.0.1:{p_port}")
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
