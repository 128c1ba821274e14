"""The SQLite experience database deleted, replaced or damaged under a live run: the run notices
(exgrpo_core/run/db_guard.py) at the step's end or before its next checkpoint, ends with one line and a
non-zero exit, is marked failed in MLflow, and its last checkpoint is left as it was."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from exgrpo_core.run.checkpoint import latest_checkpoint, resume_point
from exgrpo_core.run.db_guard import DatabaseGuard, DatabaseLostError
from flows import dependency_errors

ROOT = Path(__file__).resolve().parents[2]


def _db(path: Path) -> Path:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t (x TEXT)")
    conn.executemany("INSERT INTO t VALUES (?)", [("x" * 200,)] * 3000)
    conn.commit()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return path


def _damage(path: Path) -> None:
    """Junk over the pages past the first, in place (same file, header intact)."""
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek(4096)
        f.write(os.urandom(size - 8192))


def test_the_guard_finds_a_deleted_replaced_overwritten_or_damaged_file(tmp_path):
    db = _db(tmp_path / "a.db")
    guard = DatabaseGuard(f"sqlite:///{db}")
    guard.check(full=True)  # intact: nothing to say
    _damage(db)
    guard.check()  # the header is intact: only quick_check sees it
    with pytest.raises(DatabaseLostError, match=r"a\.db is damaged \(quick_check: "):
        guard.check(full=True)
    with open(db, "r+b") as f:
        f.write(b"\0" * 100)
    with pytest.raises(DatabaseLostError, match="was overwritten"):
        guard.check()
    db.rename(tmp_path / "b.db")
    _db(db)
    with pytest.raises(DatabaseLostError, match="was replaced by another file"):
        guard.check()
    db.unlink()
    with pytest.raises(DatabaseLostError, match=f"{db} was deleted while the run trained"):
        guard.check()
    DatabaseGuard("postgresql+psycopg://u@127.0.0.1/x").check(full=True)  # a server: not checked here
    DatabaseGuard("sqlite://").check(full=True)


def test_a_damaged_page_read_by_the_store_is_a_database_fault(tmp_path):
    db = _db(tmp_path / "a.db")
    _damage(db)
    eng = sa.create_engine(f"sqlite:///{db}")
    with pytest.raises(sa.exc.DatabaseError) as e, eng.connect() as c:
        c.execute(sa.text("SELECT count(*), max(length(x)) FROM t")).all()
    eng.dispose()
    assert dependency_errors.kind(RuntimeError("step failed")) is None
    wrapped = RuntimeError("writing the buffer update failed")
    wrapped.__cause__ = e.value
    assert dependency_errors.kind(wrapped) == "database" and dependency_errors.database_lost(wrapped)


def _rows(db: Path, sql: str):
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def _train_until(tmp_path: Path, overrides: list[str], step: int) -> subprocess.Popen:
    args = ["train", "--config", "tiny", *sum((["--set", o] for o in [
        *overrides, "run.name=lost", "run.steps=60", "run.checkpoint_every=2"]), [])]
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", *args], cwd=ROOT, env=dict(os.environ),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 600
    while time.time() < deadline:
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        try:
            if (_rows(tmp_path / "exp.db", "SELECT max(step) FROM group_results")[0][0] or -1) >= step:
                return proc
        except sqlite3.Error:
            pass
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("the run did not reach its step in time")


def _mlflow_status(tmp_path: Path) -> str:
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return run.info.status


@pytest.mark.slow
@pytest.mark.parametrize("how", ["deleted", "damaged"])
def test_a_database_lost_under_a_live_run_fails_it_in_one_line(tmp_path, prefect_server, tiny_overrides, how):
    db = tmp_path / "exp.db"
    proc = _train_until(tmp_path, tiny_overrides, 4)
    if how == "deleted":
        db.unlink()
    else:  # what a reader's checkpoint of the log put in the file, then junk over it
        conn = sqlite3.connect(db, timeout=30)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
        _damage(db)
    out, _ = proc.communicate(timeout=600)
    lines = [line for line in out.splitlines() if line.startswith("error") or "Traceback" in line]
    assert proc.returncode == dependency_errors.EXIT_CODE and len(lines) == 1, out[-4000:]
    assert "done" not in out.split("error")[-1]
    line = " ".join(out.split("error:")[-1].split())
    if how == "deleted":
        assert line.startswith(f"the experience database {db} was deleted while the run trained; run 'lost' "
                               "recorded failed in MLflow;"), line
    else:  # found by quick_check before a checkpoint, or by the store reading a damaged page first
        assert (line.startswith(f"the experience database {db} is damaged (quick_check: ")
                or line.startswith(f"the experience database at sqlite:///{db} is damaged (database disk image "
                                   "is malformed)")), line
        assert "run 'lost' recorded failed in MLflow;" in line and "could not record" not in out
    assert "resume from the last checkpoint" in line
    assert _mlflow_status(tmp_path) == "FAILED"
    ckpt = latest_checkpoint(tmp_path / "runs" / "lost")
    assert ckpt is not None and resume_point(tmp_path / "runs" / "lost") == ckpt  # intact, verified
    assert int(ckpt.name.split("_")[-1]) < 60
