"""A service dying mid-run (issue 35, item 6) ends `exgrpo train` with one line on stderr naming it, exit
status 4, no traceback (Prefect's task- and flow-failure records included), the run recorded failed in
whichever of the database and MLflow still answers, and the same command resuming it. An MLflow server
answering 503 for a while is ridden out (MLflow's client retries, flows/tracking.SERVER_RETRIES); a
PostgreSQL outage ends in the one line, and the same command resumes once the database is back."""

from __future__ import annotations

import errno
import logging
from collections import Counter
import socket
import subprocess
import sys

import pytest
from e2e_helpers import sqlite_rows

from benchmarks.reliability.proxies import FailingHttpProxy, TcpProxy, wait_for_http
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
    try:
        wait_for_http(url + "/health", proc, timeout_s=600)  # minutes on a busy 2-core machine
    except RuntimeError as e:
        pytest.fail(f"{e}: {(tmp_path / 'mlflow-server.log').read_text()[-2000:]}")
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


def test_postgresql_gone_mid_run_is_one_line_and_mlflow_says_failed(tmp_path, prefect_server, capfd, caplog,
                                                                   monkeypatch):
    import sqlalchemy as sa

    name = f"exgrpo_depfault_{_free_port()}"
    admin = sa.create_engine("postgresql+psycopg://postgres@127.0.0.1:5432/test", isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(sa.text(f"create database {name}"))
    proxy = TcpProxy()
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


def _points(client, run_id: str) -> dict[str, Counter]:
    """metric -> Counter of its MLflow steps (each count is the points at that step)."""
    return {k: Counter(m.step for m in client.get_metric_history(run_id, k)) for k in client.get_run(run_id).data.metrics}


def test_an_mlflow_server_answering_503_for_a_while_is_ridden_out_and_loses_no_point(tmp_path, prefect_server, capfd,
                                                                                    monkeypatch, mlflow_server):
    """503s for 15 s after the first step: MLflow's client retries (flows/tracking.SERVER_RETRIES), the run
    finishes, and every metric has one point per step in MLflow as in the database."""
    import mlflow

    from flows.tracking import SERVER_RETRIES

    url, _ = mlflow_server
    for k in SERVER_RETRIES:
        monkeypatch.delenv(k, raising=False)  # the defaults the run sets
    proxy = FailingHttpProxy(url)
    try:
        _after_step(monkeypatch, 0, lambda: proxy.fail_for(15))
        assert cli.main(_args(tmp_path, proxy.url, steps=3)) == 0, capfd.readouterr()[1][-3000:]
    finally:
        proxy.close()
    assert proxy.answered_503 > 0
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err and not [x for x in err.splitlines() if x.startswith("error")], err[-3000:]
    client = mlflow.MlflowClient(tracking_uri=url)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FINISHED"
    points = _points(client, run.info.run_id)
    assert all(set(c.values()) == {1} for c in points.values()), points  # no point twice
    in_db = dict(sqlite_rows(tmp_path / "exp.db", "select key, count(*) from step_metrics group by key"))
    both = set(in_db) & set(points)
    assert "perf/log_s" in both and {k: sum(points[k].values()) for k in both} == {k: in_db[k] for k in both}


def test_postgresql_down_for_20_s_is_one_line_and_the_same_command_resumes_when_it_is_back(
        tmp_path, prefect_server, capfd, caplog, monkeypatch):
    """The run's lock lives on its database connection, so an outage ends the run (one line, exit 4) rather
    than training on without it; once the database answers again the same command finishes the run."""
    import mlflow
    import sqlalchemy as sa

    name = f"exgrpo_depfault_{_free_port()}"
    admin = sa.create_engine("postgresql+psycopg://postgres@127.0.0.1:5432/test", isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(sa.text(f"create database {name}"))
    proxy, outage = TcpProxy(), []
    try:
        db_url = f"postgresql+psycopg://postgres@127.0.0.1:{proxy.port}/{name}"
        mlflow_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
        _after_step(monkeypatch, 0, lambda: outage.append(proxy.outage(20)))
        assert cli.main(_args(tmp_path, mlflow_uri, db_url=db_url, steps=3)) == 4
        _one_line(capfd, caplog, f"the experience database at {db_url} stopped answering",
                  "recorded failed in MLflow; once it answers again, rerun the same command")
        outage[0].join()  # the database answers again
        monkeypatch.setattr(train_flow, "PROGRESS", [])
        assert cli.main(_args(tmp_path, mlflow_uri, db_url=db_url, steps=3)) == 0, capfd.readouterr()[1][-3000:]
        eng = sa.create_engine(db_url)
        with eng.connect() as c:
            assert c.execute(sa.text("select status, step from runs where name='r'")).all() == [("finished", 2)]
            in_db = dict(c.execute(sa.text("select key, count(*) from step_metrics group by key")).all())
        eng.dispose()
        client = mlflow.MlflowClient(tracking_uri=mlflow_uri)
        (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
        assert run.info.status == "FINISHED"
        points = _points(client, run.info.run_id)
        assert all(set(c.values()) == {1} for c in points.values()), points
        both = set(in_db) & set(points)
        assert "perf/log_s" in both and {k: sum(points[k].values()) for k in both} == {k: in_db[k] for k in both}
    finally:
        proxy.stop()
        with admin.connect() as c:
            c.execute(sa.text(f"drop database if exists {name} with (force)"))
        admin.dispose()


def test_a_failed_state_line_is_dropped_for_its_run_exception_never_for_its_text():
    """Prefect's "Finished in state Failed(...)" line carries no exception: it is dropped when the same task
    run's exception record was a failed dependency, and kept for another error whose text merely names one."""
    from sqlalchemy.exc import OperationalError

    from flows.dependency_errors import quiet_dependency_faults

    quiet_dependency_faults()
    log = logging.getLogger("prefect.task_runs")

    def kept(msg: str, run: str, exc: BaseException | None = None) -> bool:
        info = (type(exc), exc, None) if exc else None
        return bool(log.filter(log.makeRecord(log.name, logging.ERROR, __file__, 1, msg, (), info,
                                              extra={"task_run_id": run})))

    db_gone = OperationalError("select 1", {}, Exception("server closed the connection unexpectedly"))
    user = ValueError("column OperationalError in the user's data")
    assert not kept("Task run failed with exception: OperationalError - Retries are exhausted", "a", db_gone)
    assert not kept("Finished in state Failed('Task run encountered an exception OperationalError: ...')", "a")
    assert kept("Task run failed with exception: ValueError - Retries are exhausted", "b", user)
    assert kept("Finished in state Failed('Task run encountered an exception ValueError: column "
                "OperationalError in the user's data')", "b")


def test_the_overlap_sampler_process_killed_mid_run_is_one_line_and_the_run_resumes(tmp_path, prefect_server, capfd,
                                                                                    caplog, monkeypatch):
    import multiprocessing
    import os
    import signal

    killed = []

    def kill():
        (child,) = [p for p in multiprocessing.active_children() if p.name == "exgrpo-overlap-sampler"]
        os.kill(child.pid, signal.SIGKILL)  # as the kernel's OOM killer would
        killed.append(child.pid)

    _after_step(monkeypatch, 0, kill)
    args = _args(tmp_path, f"sqlite:///{tmp_path / 'mlflow.db'}", steps=3)
    args += ["--set", "rollout.overlap=1", "--set", "rollout.overlap_sampler=process"]
    assert cli.main(args) == 4
    _one_line(capfd, caplog, f"the overlap sampler process (pid {killed[0]}) died (exit code -9)",
              "recorded failed in the experience database and MLflow; rerun the same command to resume")
    assert sqlite_rows(tmp_path / "exp.db", "select status from runs where name='r'") == [("failed",)]
    monkeypatch.setattr(train_flow, "PROGRESS", [])
    assert cli.main(args) == 0  # the same command continues the same run
    assert sqlite_rows(tmp_path / "exp.db", "select status, step from runs where name='r'") == [("finished", 2)]


def test_a_push_that_does_not_land_is_one_line_and_the_run_resumes(tmp_path, prefect_server, capfd, caplog,
                                                                   monkeypatch):
    """EngineSyncError (here the overlap sampler child's checksums, answering wrong from step 1 on) is the
    rollout engine failing: one line naming the tensor, exit 4, and the same command resumes the run."""
    from exgrpo_core.rollout import sampler_process

    real, wrong = sampler_process.compare_checksums, []
    monkeypatch.setattr(sampler_process, "compare_checksums",
                        lambda *a, **k: ["model.norm.weight"] if wrong else real(*a, **k))
    _after_step(monkeypatch, 0, lambda: wrong.append(1))
    args = _args(tmp_path, f"sqlite:///{tmp_path / 'mlflow.db'}", steps=3)
    args += ["--set", "rollout.overlap=1", "--set", "rollout.overlap_sampler=process"]
    assert cli.main(args) == 4
    _one_line(capfd, caplog, "overlap sampler process: weights differ from the trainer's after the copy",
              "e.g. model.norm.weight", "recorded failed in the experience database and MLflow; rerun the same "
              "command to resume")
    assert sqlite_rows(tmp_path / "exp.db", "select status from runs where name='r'") == [("failed",)]
    wrong.clear()  # the real checksums again
    monkeypatch.setattr(train_flow, "PROGRESS", [])
    assert cli.main(args) == 0
    assert sqlite_rows(tmp_path / "exp.db", "select status, step from runs where name='r'") == [("finished", 2)]
