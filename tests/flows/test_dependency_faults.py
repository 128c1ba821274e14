"""A service dying mid-run (issue 35, item 6) ends `exgrpo train` with one line on stderr naming it, exit
status 4, no traceback (Prefect's task- and flow-failure records included), the run recorded failed in
whichever of the database and MLflow still answers, and the same command resuming it."""

from __future__ import annotations

import errno
import logging
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from e2e_helpers import sqlite_rows

from flows import cli
from flows import train as train_flow

pytestmark = pytest.mark.slow


def _args(tmp_path, mlflow_uri: str, db_url: str | None = None, steps: int = 2):
    db_url = db_url or f"sqlite:///{tmp_path / 'exp.db'}"
    sets = [f"run.output_dir={tmp_path / 'runs'}", f"run.db_url={db_url}",
            f"run.mlflow_tracking_uri={mlflow_uri}", "run.name=r", f"run.steps={steps}", "run.checkpoint_every=1"]
    return ["train", "--config", "tiny", *sum((["--set", s] for s in sets), [])]


def _after_step(monkeypatch, step: int, action) -> None:
    def hook(done, total, metrics):
        if done == step:
            action()

    monkeypatch.setattr(train_flow, "PROGRESS", [hook])


def _one_line(capfd, caplog, service: str, *needles: str) -> str:
    """The one error line (on stderr, naming `service`); no traceback and no ERROR record anywhere."""
    errors = [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, errors
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err, err[-3000:]
    assert "| ERROR" not in out + err and " ERROR " not in out + err, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("error") or service in line]
    assert len(lines) == 1, err[-3000:]
    assert lines[0].startswith(f"error: {service}"), lines[0]
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def _mlflow_status(uri: str) -> str:
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return run.info.status


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_full_disk_at_a_checkpoint_write_is_one_line_and_the_run_resumes(tmp_path, prefect_server, capfd, caplog,
                                                                           monkeypatch):
    from exgrpo_core.run import checkpoint

    real, calls = checkpoint.save_checkpoint, []

    def full(run_dir, step, *a, **k):
        calls.append(step)
        raise OSError(errno.ENOSPC, "No space left on device", str(run_dir / "checkpoints" / ".tmp_step_0"))

    monkeypatch.setattr(checkpoint, "save_checkpoint", full)
    mlflow_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert cli.main(_args(tmp_path, mlflow_uri)) == 4
    _one_line(capfd, caplog, f"the disk under {tmp_path / 'runs' / 'r' / 'checkpoints'} is full",
              "recorded failed in the experience database and MLflow; once there is space, rerun the same command")
    assert calls == [0]
    assert sqlite_rows(tmp_path / "exp.db", "select status from runs where name='r'") == [("failed",)]
    assert _mlflow_status(mlflow_uri) == "FAILED"
    monkeypatch.setattr(checkpoint, "save_checkpoint", real)
    assert cli.main(_args(tmp_path, mlflow_uri)) == 0  # the same command continues the same run
    assert sqlite_rows(tmp_path / "exp.db", "select status, step from runs where name='r'") == [("finished", 1)]


@pytest.fixture
def mlflow_server(tmp_path):
    port = _free_port()
    log = open(tmp_path / "mlflow-server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                             "--workers", "1", "--backend-store-uri", f"sqlite:///{tmp_path / 'mlflow-server.db'}",
                             "--default-artifact-root", str(tmp_path / "mlartifacts")],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        assert proc.poll() is None, (tmp_path / "mlflow-server.log").read_text()[-2000:]
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                break
        except OSError:
            time.sleep(1)
    else:
        pytest.fail("mlflow server did not answer within 120 s")
    yield url, proc
    if proc.poll() is None:
        import os
        import signal

        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    log.close()


def test_the_mlflow_server_killed_mid_run_is_one_line_and_the_database_says_failed(tmp_path, prefect_server,
                                                                                  capfd, caplog, monkeypatch,
                                                                                  mlflow_server):
    import os
    import signal

    url, proc = mlflow_server
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")

    def kill():
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    _after_step(monkeypatch, 0, kill)
    assert cli.main(_args(tmp_path, url, steps=3)) == 4
    _one_line(capfd, caplog, f"the MLflow server at {url} stopped answering",
              "recorded failed in the experience database; once it answers again, rerun")
    assert sqlite_rows(tmp_path / "exp.db", "select status from runs where name='r'") == [("failed",)]


class _Proxy:
    """A TCP proxy to PostgreSQL that can be stopped: every connection through it is cut at once."""

    def __init__(self, port: int = 5432):
        self.target, self.socks, self.open = ("127.0.0.1", port), [], True
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while self.open:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.socks += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a, b):
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def stop(self):
        self.open = False
        try:
            self.server.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept(); close() alone would not
        except OSError:
            pass
        self.server.close()
        for s in self.socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


def test_postgresql_gone_mid_run_is_one_line_and_mlflow_says_failed(tmp_path, prefect_server, capfd, caplog,
                                                                   monkeypatch):
    import sqlalchemy as sa

    name = f"exgrpo_depfault_{_free_port()}"
    admin = sa.create_engine("postgresql+psycopg://postgres@127.0.0.1:5432/test", isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(sa.text(f"create database {name}"))
    proxy = _Proxy()
    try:
        db_url = f"postgresql+psycopg://postgres@127.0.0.1:{proxy.port}/{name}"
        mlflow_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
        _after_step(monkeypatch, 0, proxy.stop)
        assert cli.main(_args(tmp_path, mlflow_uri, db_url=db_url, steps=3)) == 4
        db = f"postgresql+psycopg://postgres@127.0.0.1:{proxy.port}/{name}"
        _one_line(capfd, caplog, f"the experience database at {db} stopped answering", "recorded failed in MLflow;")
        assert _mlflow_status(mlflow_uri) == "FAILED"
    finally:
        proxy.stop()
        with admin.connect() as c:
            c.execute(sa.text(f"drop database if exists {name} with (force)"))
        admin.dispose()
