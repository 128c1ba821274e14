"""The services with logins on, as infra/services.sh starts them (`serve mlflow`, `serve prefect`): MLflow's
basic-auth app and Prefect's API auth string refuse strangers; training, the train deployment and the
comparison's children work with the logins; no Prefect flow run keeps a database password in its parameters.

Both servers use SQLite here (EXGRPO_MLFLOW_DB_URL / EXGRPO_PREFECT_DB_URL) so they start in seconds;
the experience database of the deployment run is a fresh PostgreSQL database (dropped afterwards).
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import sqlalchemy as sa

from exgrpo_core.store.engine import scratch_postgres_database

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ROOT / "infra" / "services.sh"
PG = os.environ.get("EXGRPO_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
pytestmark = [pytest.mark.slow, pytest.mark.postgres]
ADMIN_PASSWORD = "mlflow-admin-" + secrets.token_hex(6)
AUTH_STRING = "exgrpo:prefect-" + secrets.token_hex(6)
DB_PASSWORD = "db-pw-" + secrets.token_hex(6)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _status(url: str, auth: str | None = None, body: dict | None = None) -> int:
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=90) as r:  # a login check is PBKDF2: seconds on a busy machine
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _wait_healthy(proc: subprocess.Popen, url: str, log: Path, deadline: float) -> None:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{url}: server exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=3) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    pytest.fail(f"{url} not healthy in time:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def servers():
    state = Path(tempfile.mkdtemp(prefix="exgrpo-logins-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "EXGRPO_"))}
    env.update(EXGRPO_STATE_DIR=str(state), EXGRPO_PYTHON=sys.executable, PREFECT_UI_ENABLED="false",
               EXGRPO_MLFLOW_PORT=str(_free_port()), EXGRPO_PREFECT_PORT=str(_free_port()),
               EXGRPO_MLFLOW_DB_URL=f"sqlite:///{state / 'mlflow.db'}",
               EXGRPO_PREFECT_DB_URL=f"sqlite+aiosqlite:///{state / 'prefect.db'}",
               EXGRPO_MLFLOW_ADMIN_PASSWORD=ADMIN_PASSWORD, EXGRPO_PREFECT_AUTH_STRING=AUTH_STRING)
    procs = {}
    try:
        for name in ("mlflow", "prefect"):
            procs[name] = subprocess.Popen(["bash", str(SERVICES), "serve", name], env=env, cwd=ROOT,
                                           stdout=open(state / f"{name}.out", "w"), stderr=subprocess.STDOUT,
                                           start_new_session=True)
        urls = {"mlflow": f"http://127.0.0.1:{env['EXGRPO_MLFLOW_PORT']}",
                "prefect": f"http://127.0.0.1:{env['EXGRPO_PREFECT_PORT']}/api"}
        deadline = time.monotonic() + 240
        for name, proc in procs.items():
            _wait_healthy(proc, urls[name] + "/health", state / f"{name}.out", deadline)
        yield {**urls, "procs": procs, "env": env, "state": state}
    finally:
        for proc in procs.values():  # each server in its own process group, started here
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
            _signal_group(proc.pid, signal.SIGKILL)  # whatever of the group outlived its leader
        shutil.rmtree(state, ignore_errors=True)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _cmdlines(pid: int) -> list[str]:
    """Command lines of `pid`'s process group (what `ps` shows anyone on the machine)."""
    out = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and os.getpgid(int(p.name)) == pid:
                out.append((p / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except (OSError, ProcessLookupError):
            pass
    return out


def test_mlflow_refuses_strangers_and_takes_the_training_login(servers, tmp_path, monkeypatch):
    from exgrpo_core.config.load import load_config
    from flows.tracking import MlflowRun, TrackingError, check_server

    uri = servers["mlflow"]
    search = uri + "/api/2.0/mlflow/experiments/search?max_results=1"
    assert _status(search) == 401
    assert _status(search, "admin:wrong") == 401
    assert _status(search, f"admin:{ADMIN_PASSWORD}") == 200
    assert not any(ADMIN_PASSWORD in c for c in _cmdlines(servers["procs"]["mlflow"].pid))
    for private in ("mlflow-auth.db", "mlflow-secret-key"):  # password hashes, the session key: owner only
        assert (servers["state"] / private).stat().st_mode & 0o077 == 0, private

    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
    with pytest.raises(TrackingError, match="asks for a login: set MLFLOW_TRACKING_USERNAME"):
        check_server(uri)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "wrong")
    with pytest.raises(TrackingError, match="refused the login of MLFLOW_TRACKING_USERNAME=admin"):
        check_server(uri)

    # what a training run does with the worker's login (services.sh sets these two)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", ADMIN_PASSWORD)
    check_server(uri)
    cfg = load_config("tiny", [f"run.output_dir={tmp_path}", f"run.mlflow_tracking_uri={uri}"])
    run = MlflowRun(cfg, None, tags={"exgrpo.preset": "tiny"})
    run.log_metrics({"reward/mean": 0.5}, 0)
    run.end("FINISHED")
    import mlflow

    got = mlflow.MlflowClient(tracking_uri=uri).get_run(run.run_id)
    assert got.info.status == "FINISHED" and got.data.metrics["reward/mean"] == 0.5


def test_prefect_refuses_clients_without_the_auth_string(servers):
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.exceptions import PrefectHTTPStatusError

    api = servers["prefect"]
    assert _status(api + "/flows/filter", body={}) == 401
    assert _status(api + "/flows/filter", "exgrpo:wrong", body={}) == 401
    assert _status(api + "/flows/filter", AUTH_STRING, body={}) == 200
    assert not any(AUTH_STRING in c for c in _cmdlines(servers["procs"]["prefect"].pid))
    for auth in (None, "exgrpo:wrong"):  # Prefect's own client, as a worker or `prefect deploy` uses it
        with SyncPrefectClient(api, auth_string=auth) as client, pytest.raises(PrefectHTTPStatusError, match="401"):
            client.read_work_pools()
    with SyncPrefectClient(api, auth_string=AUTH_STRING) as client:
        client.read_work_pools()


@pytest.fixture
def pg_database():
    with scratch_postgres_database(PG, "itest_logins") as url:
        yield sa.engine.make_url(url)


def _client_env(servers, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "EXGRPO_DB"))}
    return {**env, "PREFECT_API_URL": servers["prefect"], "PREFECT_HOME": str(servers["state"] / "client-home"),
            "MLFLOW_TRACKING_URI": servers["mlflow"], "MLFLOW_TRACKING_USERNAME": "admin",
            "MLFLOW_TRACKING_PASSWORD": ADMIN_PASSWORD, **extra}


def _submit(api: str, overrides: list[str]) -> tuple[str, str]:
    """Deploy the train flow, start a flow run of it as the UI's Run form does, and submit a comparison
    child as `exgrpo compare --parallel` does; returns both flow run ids."""
    from types import SimpleNamespace

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

    from flows.compare import parallel as par
    from flows.train import train

    with temporary_settings(updates={PREFECT_API_URL: api, PREFECT_API_AUTH_STRING: AUTH_STRING}):
        with get_client(sync_client=True) as client:
            client.create_work_pool(WorkPoolCreate(name="logins", type="process"), overwrite=True)
        train.to_deployment(name="logins").apply(work_pool_name="logins")
        fr = run_deployment("exgrpo-train/logins", timeout=0, parameters={"preset": "tiny", "overrides": overrides})
        child = par.Child("on_policy", 0, SimpleNamespace(run=SimpleNamespace(name="child-s0")), overrides)
        kid = par.submit(child, par.Target("exgrpo-train/logins", "logins", "default"), "p", "tiny", "mlflow-p", 0)
    return str(fr.id), str(kid.id)


def test_the_deployment_runs_with_the_logins_and_no_flow_run_keeps_the_password(servers, pg_database, tmp_path):
    """A Run from the form with a password in run.db_url, and a comparison child given one, both through
    the authenticated API; the form's run is executed as the worker executes it (prefect.engine)."""
    url = pg_database.set(password=DB_PASSWORD).render_as_string(hide_password=False)
    overrides = [f"run.db_url={url}", f"run.output_dir={tmp_path / 'runs'}", "run.steps=1"]
    form_run, child_run = _submit(servers["prefect"], overrides)
    env = _client_env(servers, PREFECT_API_AUTH_STRING=AUTH_STRING)
    ran = subprocess.run([sys.executable, "-m", "prefect.engine"], cwd=ROOT, capture_output=True, text=True,
                         env={**env, "PREFECT__FLOW_RUN_ID": form_run}, timeout=900)  # a bound, not a speed check
    assert ran.returncode == 0, (ran.stdout + ran.stderr)[-3000:]
    assert "credentials in this flow run's parameters were masked" in ran.stdout + ran.stderr

    from sqlalchemy import create_engine

    with create_engine(pg_database).connect() as c:  # it trained into the database the form named
        assert c.execute(sa.text("SELECT status FROM runs")).scalars().all() == ["finished"]

    req = urllib.request.Request(servers["prefect"] + "/flow_runs/filter", data=b"{}", headers={
        "Content-Type": "application/json",
        "Authorization": "Basic " + base64.b64encode(AUTH_STRING.encode()).decode()})
    with urllib.request.urlopen(req, timeout=10) as r:
        runs = {fr["id"]: fr for fr in json.load(r)}
    assert {form_run, child_run} <= set(runs)
    assert runs[form_run]["state_type"] == "COMPLETED"
    for fr in runs.values():
        assert DB_PASSWORD not in json.dumps(fr), fr["name"]  # parameters, and everything else recorded
    masked_url = pg_database.render_as_string(hide_password=False).replace("postgres@", "postgres:***@")
    for fr_id in (form_run, child_run):
        assert f"run.db_url={masked_url}" in runs[fr_id]["parameters"]["overrides"]


def test_the_dashboards_mlflow_login_reads_and_changes_nothing(servers):
    """`services.sh up` creates the read-only login (`mlflow_reader`; again: its password is the new one), and
    `env` exports it for `exgrpo dashboard`; it may read every experiment and change none of the admin's."""
    uri, admin = servers["mlflow"], f"admin:{ADMIN_PASSWORD}"
    for password in ("reader-" + secrets.token_hex(6), "reader-" + secrets.token_hex(6)):
        env = {**servers["env"], "EXGRPO_MLFLOW_URL": uri, "EXGRPO_MLFLOW_READER_PASSWORD": password}
        out = subprocess.run(["bash", "-c", f"source {SERVICES} env >/dev/null; mlflow_reader; {SERVICES} env"],
                             env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "export EXGRPO_MLFLOW_READER_USER='exgrpo_reader'" in out.stdout and password not in out.stdout
    reader = f"exgrpo_reader:{password}"
    experiment = uri + "/api/2.0/mlflow/experiments"
    assert _status(experiment + "/create", admin, {"name": "admins-" + secrets.token_hex(4)}) == 200
    assert _status(experiment + "/search?max_results=5", reader) == 200
    assert _status(experiment + "/search?max_results=5", "exgrpo_reader:wrong-password") == 401
    with urllib.request.urlopen(urllib.request.Request(experiment + "/search?max_results=50", headers={
            "Authorization": "Basic " + base64.b64encode(admin.encode()).decode()}), timeout=90) as r:
        eid = next(e["experiment_id"] for e in json.load(r)["experiments"] if e["name"].startswith("admins-"))
    assert _status(experiment + "/update", reader, {"experiment_id": eid, "new_name": "taken"}) == 403
    assert _status(experiment + "/delete", reader, {"experiment_id": eid}) == 403
