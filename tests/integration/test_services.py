"""The real services, started by infra/services.sh, run deployments the way the Prefect UI does.

One module-scoped set of services (unique ports, state dir and database prefix): PostgreSQL
databases and roles, MLflow server (PostgreSQL backend), Prefect server (PostgreSQL) and a process
worker. The test deploys from prefect.yaml with `prefect deploy`, starts flow runs through
`create_flow_run_from_deployment` (what the UI's "Run" calls), waits for the worker to finish them,
then reads MLflow through its server and the experience database as the read-only dashboard role.
A service that cannot start fails the test; teardown always stops the services and drops the DBs.
Run: .venv/bin/python -m pytest tests/integration/test_services.py -m slow
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from exgrpo_core import metrics as M

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ROOT / "infra" / "services.sh"
pytestmark = [pytest.mark.slow, pytest.mark.postgres]
HAS_EVALUATE = (ROOT / "flows" / "evaluate.py").exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sh(env: dict, *args: str, timeout: float = 420) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SERVICES), *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def services():
    state = Path(tempfile.mkdtemp(prefix="exgrpo-services-"))
    env = {k: v for k, v in os.environ.items()
           if k not in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "EXGRPO_DB_URL", "PREFECT_PROFILE")}
    env.update(EXGRPO_STATE_DIR=str(state), EXGRPO_DB_PREFIX=f"itest_{secrets.token_hex(4)}",
               EXGRPO_MLFLOW_PORT=str(_free_port()), EXGRPO_PREFECT_PORT=str(_free_port()),
               EXGRPO_PYTHON=sys.executable)
    try:
        t0 = time.monotonic()
        up = _sh(env, "up")
        _stage("services up", t0)
        if up.returncode != 0:
            pytest.fail(f"infra/services.sh up failed ({up.returncode}):\n{up.stdout}\n{up.stderr}")
        exports = dict(line.removeprefix("export ").split("=", 1) for line in _sh(env, "env").stdout.split("\n")
                       if line.startswith("export "))
        env.update({k: v.strip("'") for k, v in exports.items()})
        env["PREFECT_HOME"] = str(state / "prefect-home")
        yield env
    finally:
        down = _sh(env, "down", timeout=120)
        drop = _sh(env, "drop", "--yes", timeout=120)
        shutil.rmtree(state, ignore_errors=True)
        assert down.returncode == 0 and drop.returncode == 0, down.stderr + drop.stderr


def _stage(name: str, t0: float) -> float:
    print(f"[services test] {name}: {time.monotonic() - t0:.0f} s", flush=True)
    return time.monotonic()


def _deploy(env: dict, *names: str) -> None:
    args = [a for n in names for a in ("--name", n)]
    out = subprocess.run([sys.executable, "-m", "prefect", "--no-prompt", "deploy", *args], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]


async def _run_deployment(name: str, parameters: dict, timeout: float = 400):
    """Create a flow run from the deployment (the UI's Run) and wait until the worker finishes it."""
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        deployment = await client.read_deployment_by_name(name)
        run = await client.create_flow_run_from_deployment(deployment.id, parameters=parameters)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            run = await client.read_flow_run(run.id)
            if run.state is not None and run.state.is_final():
                return deployment, run
            await asyncio.sleep(2)
    raise AssertionError(f"flow run of {name} still {run.state} after {timeout} s")


def _in_env(env: dict):
    """Point this process's Prefect client at the test's server (settings are read per context)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    return temporary_settings({PREFECT_API_URL: env["PREFECT_API_URL"]})


def test_train_and_evaluate_deployments_run_on_the_real_services(services, tmp_path):
    env = services
    t0 = time.monotonic()
    names = ["exgrpo-train"] + (["exgrpo-evaluate"] if HAS_EVALUATE else [])
    _deploy(env, *names)
    t0 = _stage("prefect deploy", t0)
    run_name = f"itest-{secrets.token_hex(3)}"
    out_dir = tmp_path / "runs"
    overrides = [f"run.output_dir={out_dir}", f"run.name={run_name}", "run.steps=2"]
    worker_log = Path(env["EXGRPO_STATE_DIR"]) / "worker.log"
    with _in_env(env):
        deployment, train = asyncio.run(_run_deployment(
            "exgrpo-train/exgrpo-train", {"preset": "tiny", "overrides": overrides}))
        assert train.state.is_completed(), f"{train.state}\n{worker_log.read_text()[-4000:]}"
        t0 = _stage("train flow run", t0)
        # the form the UI renders for this deployment: typed preset/overrides, the documented config tree
        schema = deployment.parameter_openapi_schema
        assert schema["properties"]["preset"]["type"] == "string"
        assert {"$ref": "#/definitions/ExGRPOConfig"} in schema["properties"]["config"]["anyOf"]
        assert schema["definitions"]["RolloutConfig"]["properties"]["group_size"]["description"]
        if HAS_EVALUATE:
            eval_sets = [f"run.output_dir={out_dir}", "eval.suites=[bundled:tiny-arith]", "eval.max_questions=4"]
            _, ev = asyncio.run(_run_deployment(
                "exgrpo-evaluate/exgrpo-evaluate", {"preset": "tiny", "overrides": eval_sets, "run": run_name}))
            assert ev.state.is_completed(), f"{ev.state}\n{worker_log.read_text()[-4000:]}"
            t0 = _stage("evaluate flow run", t0)

    run_id = _check_database(env["EXGRPO_DASHBOARD_DB_URL"], run_name)
    _check_mlflow(env["MLFLOW_TRACKING_URI"], run_name, run_id, Path(env["EXGRPO_STATE_DIR"]))


def _check_database(url: str, run_name: str) -> str:
    """Read as the dashboard role: the run's rows are there, and the role cannot write."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as c:
            run_id = c.execute(sa.text("SELECT id FROM runs WHERE name = :n"), {"n": run_name}).scalar_one()
            count = lambda table: c.execute(  # noqa: E731
                sa.text(f"SELECT count(*) FROM {table} WHERE run_id = :r"), {"r": run_id}).scalar_one()
            assert count("trajectories") > 0 and count("question_states") > 0
            steps = c.execute(sa.text("SELECT step FROM step_metrics WHERE run_id = :r AND key = :k"),
                              {"r": run_id, "k": M.REWARD_MEAN}).scalars().all()
            assert sorted(steps) == [0, 1]
            if HAS_EVALUATE:
                assert count("eval_results") > 0
        with engine.connect() as c:
            c.execute(sa.text("SET default_transaction_read_only = off"))
            c.commit()  # the next transaction is read-write: only the missing privilege stops the DELETE
            with pytest.raises(sa.exc.ProgrammingError, match="permission denied"):
                c.execute(sa.text("DELETE FROM trajectories WHERE run_id = :r"), {"r": run_id})
    finally:
        engine.dispose()
    return run_id


def _check_mlflow(uri: str, run_name: str, run_id: str, state: Path) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("exgrpo")
    [run] = client.search_runs([experiment.experiment_id], f"tags.`exgrpo.run_id` = '{run_id}'")
    assert run.info.status == "FINISHED" and run.info.run_name == run_name
    history = client.get_metric_history(run.info.run_id, M.REWARD_MEAN)
    assert sorted(m.step for m in history) == [1, 2]  # step numbers: the database stores 0 and 1
    if HAS_EVALUATE:
        assert any(k.startswith("eval/") for k in run.data.metrics), sorted(run.data.metrics)
    assert not any(k.endswith("db_url") and v not in ("None", "") for k, v in run.data.params.items())
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "summary.json"} <= artifacts
    # served artifacts land in the server's local artifact root, not in the client's folder
    assert list((state / "mlflow-artifacts").rglob("summary.json"))
