"""Every MLflow link a user is given opens MLflow 3.17's model-training view, not the GenAI view a fresh
browser gets by default (issue 34 item 8): the UI reads `?workflowType=machine_learning` from the page's
hash route (the installed UI's WorkflowTypeProvider), else the browser's stored choice (GenAI when none).
Links: the ones a training run prints and logs (flows/tracking.py) and the dashboard's (dashboard/links.py).
MLflow's own end-of-run lines carry no such parameter, so they are replaced by ours."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from dashboard import links
from exgrpo_core.config.load import load_config
from flows.tracking import MlflowRun

VIEW = "workflowType=machine_learning"


@pytest.fixture
def mlflow_server(tmp_path):
    """URL of a real `mlflow server` (an http store: the one kind whose runs have web pages)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "mlflow-server.log"
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                             "--workers", "1", "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
                             "--default-artifact-root", str(tmp_path / "mlartifacts")],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 400  # a loaded CI machine starts it slowly
        while True:
            assert proc.poll() is None and time.time() < deadline, log.read_text()[-2000:]
            try:
                with urllib.request.urlopen(url + "/health", timeout=2):
                    break
            except OSError:
                time.sleep(1)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_links_printed_and_logged_for_a_run_open_the_training_view(mlflow_server, tmp_path, capsys):
    url = mlflow_server
    cfg = load_config("tiny", [f"run.mlflow_tracking_uri={url}", f"run.output_dir={tmp_path}", "run.name=links"])
    run = MlflowRun(cfg, None, tags={})
    page = f"{url}/#/experiments/{run.experiment_id}/runs/{run.run_id}?{VIEW}"
    assert run.run_url == page and run.experiment_url == f"{url}/#/experiments/{run.experiment_id}?{VIEW}"
    capsys.readouterr()
    run.end("FINISHED")
    out = capsys.readouterr().out
    shown = re.findall(r"https?://\S+", out)
    assert page in shown, out  # the finished run's link, printed
    assert all(VIEW in u for u in shown if "#/experiments" in u), out  # and no link into the GenAI view
    assert links.mlflow_run_url(url, run.experiment_id, run.run_id) == page  # the dashboard's link
