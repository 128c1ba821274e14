"""The run lock covers what it protects (issue 35, item 2): the run in its database and its folder.

Each scenario holds the lock in another process, as a second `exgrpo train` would meet it:
(a) two output folders sharing one SQLite file, (b) one folder with PostgreSQL and the default SQLite,
(c) two fresh starts at the same moment, where the refused one must not delete the winner's folder.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from exgrpo_core.run import locks

ROOT = Path(__file__).resolve().parents[2]
PG_URL = os.environ.get("EXGRPO_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
HOLD = ("import os, sys, time; from exgrpo_core.run.locks import lock_run; os.makedirs(sys.argv[1], exist_ok=True); "
        "lock_run(sys.argv[1], sys.argv[2], sys.argv[3]); print('held', flush=True); time.sleep(600)")


class Holder:
    """Another process holding `lock_run(run_dir, name, db_url)` until the block ends (then SIGKILLed)."""

    def __init__(self, run_dir: Path, name: str, db_url: str):
        self.proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir), name, db_url], cwd=ROOT,
                                     stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert self.proc.stdout.readline().strip() == "held"

    def __enter__(self):
        return self.proc

    def __exit__(self, *exc):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


def test_two_folders_sharing_one_sqlite_file_are_one_run(tmp_path):
    db = f"sqlite:///{tmp_path / 'shared.db'}"
    with Holder(tmp_path / "a" / "r", "r", db) as first:
        with pytest.raises(locks.RunLockedError) as e:
            locks.lock_run(tmp_path / "b" / "r", "r", db)
        msg = str(e.value)
        assert f"pid {first.pid} on" in msg and str(tmp_path / "a" / "r") in msg and "\n" not in msg
        assert not locks.holds(tmp_path / "b" / "r")
        locks.lock_run(tmp_path / "b" / "other", "other", db)  # another run name in the same file is free
        locks.unlock_run(tmp_path / "b" / "other")
    locks.lock_run(tmp_path / "b" / "r", "r", db)  # freed by the holder's death
    locks.unlock_run(tmp_path / "b" / "r")


def test_two_folders_sharing_one_sqlite_file_refuse_the_second_session(tmp_path):
    """End to end: the second session is refused before it reads the database (it rolled the live run back)."""
    from exgrpo_core.config.load import load_config
    from exgrpo_core.run.session import open_session

    db = f"sqlite:///{tmp_path / 'shared.db'}"
    with Holder(tmp_path / "a" / "r", "r", db):
        cfg = load_config("tiny", [f"run.output_dir={tmp_path / 'b'}", f"run.db_url={db}", "run.name=r"])
        with pytest.raises(locks.RunLockedError, match="run 'r' is already running"):
            open_session(cfg, verify=lambda t, a: [(0.0, "wrong")] * len(t))
        assert not (tmp_path / "shared.db").exists()  # nothing read or written


@pytest.mark.postgres
def test_one_folder_with_postgres_and_sqlite_is_one_run(tmp_path):
    run_dir = tmp_path / "runs" / f"mixed-{os.getpid()}"
    with Holder(run_dir, run_dir.name, PG_URL) as first:
        with pytest.raises(locks.RunLockedError, match=f"pid {first.pid} on"):
            locks.lock_run(run_dir, run_dir.name, f"sqlite:///{run_dir / 'experience.db'}")
    with Holder(run_dir, run_dir.name, f"sqlite:///{run_dir / 'experience.db'}") as first:
        with pytest.raises(locks.RunLockedError, match=f"pid {first.pid} on"):
            locks.lock_run(run_dir, run_dir.name, PG_URL)


def test_refused_fresh_start_leaves_the_winners_folder(tmp_path, monkeypatch):
    """Two `exgrpo train` of a new run at once: the winner makes and locks the folder while the other is in
    its checks; the refused one must not remove the folder it did not create (both failed, 3 of 3)."""
    from flows import cli
    from exgrpo_core.run import session

    run_dir = tmp_path / "runs" / "race"
    holder: list[Holder] = []
    real = session.check_context

    def winner_starts_now(cfg):
        holder.append(Holder(run_dir, "race", f"sqlite:///{run_dir / 'experience.db'}"))
        return real(cfg)

    monkeypatch.setattr(session, "check_context", winner_starts_now)
    args = cli.build_parser().parse_args(["train", "--config", "tiny", "--set", f"run.output_dir={tmp_path / 'runs'}",
                                          "--set", "run.name=race"])
    try:
        with pytest.raises(locks.RunLockedError, match="run 'race' is already running"):
            cli.cmd_train(args)
        assert run_dir.is_dir() and (run_dir / ".lock").read_text().startswith(f"pid {holder[0].proc.pid} on")
    finally:
        for h in holder:
            h.__exit__()


def test_hard_linked_names_of_one_sqlite_file_are_one_run(tmp_path):
    """A second name of the same file (`ln a/exp.db b/exp.db`) is the same database: the lock is keyed on the
    file (st_dev, st_ino), not on its path."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "exp.db").touch()
    os.link(tmp_path / "a" / "exp.db", tmp_path / "b" / "exp.db")
    with Holder(tmp_path / "runs-a" / "r", "r", f"sqlite:///{tmp_path / 'a' / 'exp.db'}") as first:
        with pytest.raises(locks.RunLockedError, match=f"pid {first.pid} on") as e:
            locks.lock_run(tmp_path / "runs-b" / "r", "r", f"sqlite:///{tmp_path / 'b' / 'exp.db'}")
        assert "\n" not in str(e.value) and not locks.holds(tmp_path / "runs-b" / "r")
    locks.lock_run(tmp_path / "runs-b" / "r", "r", f"sqlite:///{tmp_path / 'b' / 'exp.db'}")  # freed by its death
    locks.unlock_run(tmp_path / "runs-b" / "r")


def test_a_file_created_after_the_lock_is_pinned_once_it_exists(tmp_path):
    """A fresh run locks before its database exists; once the session has created it, a hard link made then
    meets the lock too."""
    db = tmp_path / "a" / "exp.db"
    db.parent.mkdir()
    locks.lock_run(tmp_path / "runs" / "r", "r", f"sqlite:///{db}")
    try:
        db.touch()
        locks.pin_database(tmp_path / "runs" / "r", "r", f"sqlite:///{db}")
        os.link(db, tmp_path / "linked.db")
        out = subprocess.run([sys.executable, "-c", HOLD, str(tmp_path / "other" / "r"), "r",
                              f"sqlite:///{tmp_path / 'linked.db'}"], cwd=ROOT, capture_output=True, text=True,
                             timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert out.returncode == 1 and f"pid {os.getpid()} on" in out.stderr, out.stderr[-2000:]
    finally:
        locks.unlock_run(tmp_path / "runs" / "r")
