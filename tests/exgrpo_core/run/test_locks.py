"""One process per run (exgrpo_core/run/locks.py): a second opener is refused with one line naming the holder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from store_helpers import PG_URL

from exgrpo_core.config.load import load_config
from exgrpo_core.run import locks
from exgrpo_core.run.session import open_session


def _cfg(tmp_path, *extra):
    return load_config("tiny", [f"run.output_dir={tmp_path}", f"run.db_url=sqlite:///{tmp_path / 'x.db'}",
                                "run.name=one", *extra])


def test_second_session_on_the_same_run_is_refused_naming_the_holder(tmp_path):
    s = open_session(_cfg(tmp_path), verify=lambda t, a: [(0.0, "wrong")] * len(t))
    try:
        # another process would be refused; inside this one, drop the registry entry to open it again
        held = locks._HELD.pop(str(s.run_dir))
        with pytest.raises(locks.RunLockedError) as e:
            open_session(_cfg(tmp_path))
        msg = str(e.value)
        assert "run 'one' is already running" in msg and f"pid {os.getpid()}" in msg and "\n" not in msg
        locks._HELD[str(s.run_dir)] = held
    finally:
        s.close()
    s2 = open_session(_cfg(tmp_path), verify=lambda t, a: [(0.0, "wrong")] * len(t))  # freed by close
    s2.close()


def test_file_lock_is_freed_when_its_holder_is_killed(tmp_path):
    code = ("import sys, time; from exgrpo_core.run.locks import RunLock; RunLock.file(sys.argv[1], 'r'); "
            "print('held', flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    with pytest.raises(locks.RunLockedError, match=f"pid {proc.pid} on"):
        locks.RunLock.file(tmp_path, "r")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    locks.RunLock.file(tmp_path, "r").release()


@pytest.mark.postgres
def test_postgres_advisory_lock_refuses_a_second_holder_by_run_name(tmp_path):
    name = f"lock-test-{os.getpid()}"
    first = locks.lock_run(tmp_path / "a", name, PG_URL)
    try:
        with pytest.raises(locks.RunLockedError) as e:  # another output dir, same database and run name
            locks.lock_run(tmp_path / "b", name, PG_URL)
        assert f"run '{name}' is already running (exgrpo run {name}: pid {os.getpid()}" in str(e.value)
    finally:
        locks.unlock_run(tmp_path / "a")
    assert first._release is None
    locks.lock_run(tmp_path / "b", name, PG_URL)
    locks.unlock_run(tmp_path / "b")


def test_failed_start_removes_only_the_empty_folder_this_process_created(tmp_path):
    made = tmp_path / "runs" / "made"
    locks.make_run_dir(made)
    locks.lock_run(made, "made", f"sqlite:///{made / 'experience.db'}")
    assert sorted(p.name for p in made.iterdir())[0] == ".lock"  # and the database's lock beside its file
    assert locks.remove_failed_start(made) and not made.exists() and not locks.holds(made)
    found = tmp_path / "runs" / "found"
    found.mkdir()
    locks.make_run_dir(found)  # existed already: not this process's
    assert not locks.remove_failed_start(found) and found.is_dir()
    kept = tmp_path / "runs" / "kept"
    locks.make_run_dir(kept)
    (kept / "experience.db").write_bytes(b"")
    assert not locks.remove_failed_start(kept) and kept.is_dir()  # it holds more than lock files


@pytest.mark.parametrize("name", ["../escape", "a/b", "..", ".", "", "x\x00y", "tab\there", "a\\b", "n" * 201])
def test_run_names_that_are_not_one_folder_name_are_refused(name):
    from exgrpo_core.config.load import ConfigError

    with pytest.raises(ConfigError, match="run.name .* is not a folder name"):
        locks.check_run_name(name)


def test_a_run_name_escaping_the_output_folder_creates_nothing(tmp_path, capsys):
    from flows.cli import main

    out = tmp_path / "runs"
    rc = main(["train", "--config", "tiny", "--set", f"run.output_dir={out}", "--set", "run.name=../escape"])
    text = capsys.readouterr().out
    assert rc == 2 and "run.name '../escape' is not a folder name" in text and "Traceback" not in text
    assert not (tmp_path / "escape").exists()
    with pytest.raises(Exception, match="is not a folder name"):
        open_session(_cfg(tmp_path, "run.name=../escape2"))  # the Prefect form's path: no CLI preflight
    assert not (tmp_path / "escape2").exists()


@pytest.mark.postgres
def test_releasing_a_lock_whose_server_connection_died_never_raises(tmp_path):
    """PostgreSQL restarted or the connection cut: the lock went with the session, and releasing it must not
    raise over the error that ended the run (a failing pg_advisory_unlock hid it, issue 35 item 6)."""
    import sqlalchemy as sa

    name = f"dead-conn-{os.getpid()}"
    locks.lock_run(tmp_path / "r", name, PG_URL)
    admin = sa.create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        killed = c.execute(sa.text("select pg_terminate_backend(pid) from pg_stat_activity "
                                   "where application_name like :n"), {"n": f"exgrpo run {name}:%"}).scalars().all()
    admin.dispose()
    assert killed == [True]
    locks.unlock_run(tmp_path / "r")  # no exception
    assert not locks.holds(tmp_path / "r")
    locks.lock_run(tmp_path / "r", name, PG_URL)  # free again
    locks.unlock_run(tmp_path / "r")
