"""One real tiny training session for the dashboard tests: two runs in one SQLite database and MLflow store.

`exgrpo` trains 8 steps with replay on from the start and evaluates every 4 steps and at the end;
`on-policy` trains 5 steps with replay_ratio = 0 and a start threshold no step can pass (replay never
on). Both go through the Prefect training flow (session server from tests/conftest.py) in one subprocess.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

ROOT = Path(__file__).resolve().parents[2]
TRAIN = """
import sys
from exgrpo_core.config.load import load_config
from flows.train import train
folder = sys.argv[1]
common = [f"run.output_dir={folder}/runs", f"run.db_url=sqlite:///{folder}/exp.db",
          f"run.mlflow_tracking_uri=sqlite:///{folder}/mlflow.db"]
train(config=load_config("tiny", common + ["run.name=on-policy", "run.steps=5", "buffer.replay_ratio=0",
                                           "buffer.start_threshold=1"]))
train(config=load_config("tiny", common + ["run.name=exgrpo", "run.steps=8", "eval.every=4", "eval.final=true",
                                           'eval.suites=["bundled:tiny-arith"]']))
"""


class Trained:
    """Where the session's runs live, and raw SQL on them for the tests' expected values."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.db_url = f"sqlite:///{folder / 'exp.db'}"
        self.mlflow_uri = f"sqlite:///{folder / 'mlflow.db'}"
        self.ids = dict((name, rid) for rid, name in self.sql("select id, name from runs"))

    def sql(self, query: str, **params) -> list[tuple]:
        engine = sa.create_engine(self.db_url)
        try:
            with engine.connect() as conn:
                return [tuple(r) for r in conn.execute(sa.text(query), params)]
        finally:
            engine.dispose()

    def one(self, query: str, **params):
        return self.sql(query, **params)[0][0]


@pytest.fixture(scope="session")
def trained(prefect_server, tmp_path_factory) -> Trained:
    folder = tmp_path_factory.mktemp("dashboard-runs")
    env = {**os.environ, "PREFECT_API_URL": prefect_server}
    out = subprocess.run([sys.executable, "-c", TRAIN, str(folder)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=900)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    t = Trained(folder)
    assert set(t.ids) == {"exgrpo", "on-policy"}, t.ids
    return t


@pytest.fixture
def dashboard_env(monkeypatch, trained):
    """Point the dashboard (AppTest runs it in this process) at the trained runs."""
    monkeypatch.setenv("EXGRPO_DB_URL", trained.db_url)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", trained.mlflow_uri)
    return trained


@pytest.fixture
def exgrpo_running(dashboard_env, tmp_path, monkeypatch) -> Trained:
    """The trained runs in a copy of the database where `exgrpo` is still marked running (live pages)."""
    db = tmp_path / "exp.db"
    shutil.copy(dashboard_env.folder / "exp.db", db)
    engine = sa.create_engine(f"sqlite:///{db}")
    with engine.begin() as conn:
        conn.execute(sa.text("update runs set status='running' where name='exgrpo'"))
    engine.dispose()
    monkeypatch.setenv("EXGRPO_DB_URL", f"sqlite:///{db}")
    return dashboard_env
