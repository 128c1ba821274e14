"""infra/services.sh db: databases, the training and read-only dashboard roles, passwords from env.

Uses a unique database prefix and unique role names, and removes both afterwards.
"""

from __future__ import annotations

import os
import secrets
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ROOT / "infra" / "services.sh"
ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
pytestmark = pytest.mark.postgres


def _sh(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SERVICES), *args], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture
def setup_env(tmp_path):
    tag = secrets.token_hex(4)
    env = {**os.environ, "EXGRPO_STATE_DIR": str(tmp_path / "state"), "EXGRPO_DB_PREFIX": f"pgtest_{tag}",
           "EXGRPO_TRAIN_ROLE": f"pgtest_train_{tag}", "EXGRPO_DASHBOARD_ROLE": f"pgtest_dash_{tag}",
           "EXGRPO_SERVICES_ROLE": f"pgtest_svc_{tag}", "EXGRPO_PYTHON": sys.executable,
           "EXGRPO_TRAIN_PASSWORD": f"pw'{tag}:x", "EXGRPO_DASHBOARD_PASSWORD": f"dash-{tag}"}
    yield env
    drop = _sh(env, "drop", "--yes")
    admin = sa.create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        for key in ("EXGRPO_TRAIN_ROLE", "EXGRPO_DASHBOARD_ROLE", "EXGRPO_SERVICES_ROLE"):
            c.execute(sa.text(f'DROP ROLE IF EXISTS "{env[key]}"'))
    admin.dispose()
    assert drop.returncode == 0, drop.stderr


def _url(env: dict, role_key: str) -> str:
    return f"postgresql+psycopg://{env[role_key]}@127.0.0.1:5432/{env['EXGRPO_DB_PREFIX']}_experience"


def test_db_setup_is_idempotent_and_the_dashboard_role_reads_future_tables_only(setup_env):
    env = setup_env
    for _ in range(2):  # a second run changes nothing and does not fail
        out = _sh(env, "db")
        assert out.returncode == 0, out.stdout + out.stderr
    admin = sa.create_engine(ADMIN_URL)
    with admin.connect() as c:
        dbs = set(c.execute(sa.text("SELECT datname FROM pg_database WHERE datname LIKE :p"),
                            {"p": env["EXGRPO_DB_PREFIX"] + "%"}).scalars())
        with_pw = dict(c.execute(sa.text("SELECT rolname, rolpassword IS NOT NULL FROM pg_authid "
                                         "WHERE rolname LIKE :p"), {"p": "pgtest_%_" + env["EXGRPO_DB_PREFIX"][7:]}).all())
    admin.dispose()
    prefix = env["EXGRPO_DB_PREFIX"]
    assert dbs == {f"{prefix}_experience", f"{prefix}_mlflow", f"{prefix}_prefect"}
    assert with_pw == {env["EXGRPO_TRAIN_ROLE"]: True, env["EXGRPO_DASHBOARD_ROLE"]: True,
                       env["EXGRPO_SERVICES_ROLE"]: False}
    # passwords reach clients through a private pgpass file, never through a URL or the output
    pgpass = Path(env["EXGRPO_STATE_DIR"]) / "pgpass"
    assert stat.S_IMODE(pgpass.stat().st_mode) == 0o600
    assert f"{env['EXGRPO_TRAIN_ROLE']}:pw'{prefix[7:]}\\:x" in pgpass.read_text()
    shown = _sh(env, "env").stdout
    assert env["EXGRPO_TRAIN_PASSWORD"] not in shown and f"PGPASSFILE='{pgpass}'" in shown

    train = sa.create_engine(_url(env, "EXGRPO_TRAIN_ROLE"))
    with train.begin() as c:  # the migrations ran as the training role; a table it adds later ...
        assert c.execute(sa.text("SELECT count(*) FROM runs")).scalar_one() == 0
        c.execute(sa.text("CREATE TABLE later_table (x int)"))
        c.execute(sa.text("INSERT INTO later_table VALUES (1)"))
    train.dispose()
    dash = sa.create_engine(_url(env, "EXGRPO_DASHBOARD_ROLE"))
    with dash.connect() as c:  # ... the dashboard role can read (default privileges), not write
        assert c.execute(sa.text("SELECT x FROM later_table")).scalar_one() == 1
        c.execute(sa.text("SET default_transaction_read_only = off"))
        c.commit()
        for sql in ("INSERT INTO later_table VALUES (2)", "DELETE FROM runs", "CREATE TABLE t2 (x int)"):
            with pytest.raises(sa.exc.ProgrammingError, match="permission denied"):
                c.execute(sa.text(sql))
            c.rollback()
    dash.dispose()


def test_only_the_training_role_takes_advisory_locks(setup_env):
    """The read-only dashboard role could hold a run's advisory lock and block every run (issue 35, item 7)."""
    from exgrpo_core.run import locks

    env = setup_env
    out = _sh(env, "db")
    assert out.returncode == 0, out.stdout + out.stderr
    dash = sa.create_engine(_url(env, "EXGRPO_DASHBOARD_ROLE"))
    with dash.connect() as c:
        for sql in ("SELECT pg_try_advisory_lock(1)", "SELECT pg_advisory_lock(1, 2)", "SELECT pg_advisory_xact_lock(3)"):
            with pytest.raises(sa.exc.ProgrammingError, match="permission denied"):
                c.execute(sa.text(sql))
            c.rollback()
    dash.dispose()
    train = sa.create_engine(_url(env, "EXGRPO_TRAIN_ROLE"))
    locks.RunLock.postgres(train, "run-a").release()  # the run lock, as the training role takes it
    train.dispose()


def test_bad_prefix_is_refused_before_anything_is_created(tmp_path):
    env = {**os.environ, "EXGRPO_STATE_DIR": str(tmp_path), "EXGRPO_DB_PREFIX": "Bad-Name; drop"}
    out = _sh(env, "db")
    assert out.returncode == 2 and "EXGRPO_DB_PREFIX must be" in out.stderr
    assert not any(tmp_path.iterdir())
