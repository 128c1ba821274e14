"""A real full file system (a small tmpfs, mounted here: the tests run as root) under a run: every way
ENOSPC arrives (an OSError, torch's zip writer's RuntimeError, SQLite's "database or disk is full") is
one line naming the folder and the space free and needed, exit 4; the previous checkpoint stays intact
and, with space again, the same command resumes from it and finishes."""

from __future__ import annotations

import errno
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from exgrpo_core.run import disk_space
from exgrpo_core.run.checkpoint import resume_point
from flows import dependency_errors

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def small_disk(tmp_path):
    """A 1800 KiB tmpfs at tmp_path/disk: one tiny checkpoint fits, a second one does not."""
    where = tmp_path / "disk"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1800k", "tmpfs", str(where)], check=True)
    yield where
    subprocess.run(["umount", "-l", str(where)], check=True)


def _fill(folder: Path) -> None:
    with open(folder / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError as e:
            assert e.errno == errno.ENOSPC


def test_each_form_of_enospc_on_a_full_tmpfs_is_a_full_disk(small_disk, tmp_path):
    _fill(small_disk)
    with pytest.raises(RuntimeError) as zip_err:  # torch's zip writer: no errno at all
        torch.save({"w": torch.zeros(100_000)}, small_disk / "state.pt")
    assert "errno" not in str(zip_err.value).lower()
    assert disk_space.is_disk_full(zip_err.value, small_disk)
    assert not disk_space.is_disk_full(RuntimeError("unrelated"), tmp_path)  # a roomy disk: not a full one
    assert disk_space.is_disk_full(OSError(errno.ENOSPC, "No space left on device"), tmp_path)
    full = disk_space.disk_full(small_disk, 3 << 20, "the checkpoint", filename=small_disk / ".tmp_step_000002")
    assert full.errno == errno.ENOSPC and full.detail.endswith("free, the checkpoint needs about 3.0 MiB")
    assert dependency_errors.kind(RuntimeError("task failed")) is None

    (small_disk / "filler").unlink()
    conn = sqlite3.connect(small_disk / "exp.db")
    conn.execute("CREATE TABLE t (x BLOB)")
    with pytest.raises(sqlite3.OperationalError, match="database or disk is full") as db_err:
        for _ in range(100):
            conn.execute("INSERT INTO t VALUES (?)", (os.urandom(65536),))
        conn.commit()
    conn.close()
    assert dependency_errors.kind(db_err.value) == "disk"


def _cli(tmp_path: Path, disk: Path):
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home")}
    env.pop("PREFECT_API_URL", None)
    args = [f"run.output_dir={disk}", f"run.db_url=sqlite:///{tmp_path / 'exp.db'}",
            f"run.mlflow_tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}", "run.name=full", "run.steps=4",
            "run.checkpoint_every=1"]
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "train", "--config", "tiny",
                           *sum((["--set", a] for a in args), [])], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.slow
def test_a_real_full_disk_at_a_checkpoint_write_is_one_line_and_the_run_resumes(small_disk, tmp_path):
    rc, out = _cli(tmp_path, small_disk)
    errors = [line for line in out.splitlines() if line.startswith("error")]
    assert rc == dependency_errors.EXIT_CODE and len(errors) == 1 and "Traceback" not in out, out[-4000:]
    line = " ".join(out.split("error:")[-1].split())
    assert line.startswith(f"the disk under {small_disk / 'full' / 'checkpoints'} is full ("), line
    assert " free, the checkpoint needs about 1." in line and "MiB); run 'full' recorded failed" in line, line
    ckpts = small_disk / "full" / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_000001"]  # the partial write removed
    assert resume_point(small_disk / "full") == ckpts / "step_000001"  # the previous one intact

    subprocess.run(["mount", "-o", "remount,size=16m", str(small_disk)], check=True)  # space again
    rc, out = _cli(tmp_path, small_disk)
    assert rc == 0 and "resumed run" in out and "after step 1 (checkpoint step_000001)" in out, out[-4000:]
    assert resume_point(small_disk / "full") == ckpts / "step_000004"
