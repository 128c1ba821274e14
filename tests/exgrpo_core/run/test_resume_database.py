"""A checkpoint is resumed only into the database that holds its run up to its step (issue 35, item 3):
a deleted or replaced experience database is one line naming both, before any model loads."""

from __future__ import annotations

import shutil
import sqlite3

import pytest

from exgrpo_core.config.load import load_config
from exgrpo_core.loop import run_iteration
from exgrpo_core.run.session import ResumeError, open_session


def _cfg(tmp_path):
    return load_config("tiny", [f"run.output_dir={tmp_path}", f"run.db_url=sqlite:///{tmp_path / 'exp.db'}",
                                "run.name=kept", "run.steps=2"])


def _wrong(texts, answers):
    return [(0.0, "wrong")] * len(texts)


def _train(tmp_path, steps: int, backup_after: int | None = None) -> str:
    s = open_session(_cfg(tmp_path), verify=_wrong)
    try:
        for _ in range(steps):
            run_iteration(s)
            s.save()
            if backup_after is not None and s.step - 1 == backup_after:
                src = sqlite3.connect(tmp_path / "exp.db")
                src.execute("VACUUM INTO ?", (str(tmp_path / "backup.db"),))  # a consistent copy, WAL included
                src.close()
        return s.run_id
    finally:
        s.close()


def test_resume_into_a_deleted_database_is_refused_naming_both(tmp_path):
    run_id = _train(tmp_path, 1)
    for suffix in ("", "-wal", "-shm"):
        (tmp_path / f"exp.db{suffix}").unlink(missing_ok=True)
    with pytest.raises(ResumeError) as e:
        open_session(_cfg(tmp_path), verify=_wrong)
    msg = str(e.value)
    assert f"step_000001 is step 1 of run {run_id}" in msg and "has no such run" in msg and "\n" not in msg
    assert str(tmp_path / "exp.db") in msg and "run.db_url" in msg and "aside" in msg
    assert not (tmp_path / "exp.db").exists()  # not created by the check


def test_resume_into_an_older_copy_of_the_database_is_refused(tmp_path):
    run_id = _train(tmp_path, 2, backup_after=0)
    for suffix in ("-wal", "-shm"):
        (tmp_path / f"exp.db{suffix}").unlink(missing_ok=True)
    shutil.copy(tmp_path / "backup.db", tmp_path / "exp.db")  # a backup taken after step 1 (index 0)
    with pytest.raises(ResumeError, match=f"step_000002 is step 2 of run {run_id}, .* stores it only up to step 1"):
        open_session(_cfg(tmp_path), verify=_wrong)


def test_resume_into_the_database_it_trained_with_goes_on(tmp_path):
    _train(tmp_path, 1)
    s = open_session(_cfg(tmp_path), verify=_wrong)
    try:
        assert s.resumed_from == 0 and s.step == 1
    finally:
        s.close()
