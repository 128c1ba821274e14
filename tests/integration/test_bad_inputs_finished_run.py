"""Bad inputs against a finished run, continued with more steps: each ends in one early line (exit 2, no
traceback) before Prefect starts (its API is out of reach here), and the run's status stays as it was, in
the experience database and in MLflow."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_bad_inputs import one_early_line

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
NAME = "finished"


def _train(folder: Path, sets: list[str], prefect_api: str | None) -> tuple[int, str]:
    args = [sys.executable, "-m", "flows.cli", "train", "--config", "tiny"]
    for s in [f"run.output_dir={folder / 'runs'}", f"run.db_url=sqlite:///{folder / 'exp.db'}", f"run.name={NAME}",
              f"run.mlflow_tracking_uri=sqlite:///{folder / 'mlflow.db'}", *sets]:
        args += ["--set", s]
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(PREFECT_HOME=str(folder / "ph"), **({"PREFECT_API_URL": prefect_api} if prefect_api else {}))
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("finished")
    rc, out = _train(folder, ["run.steps=2"], prefect_api=None)  # Prefect's ephemeral API
    assert rc == 0, out[-3000:]
    return folder


def _statuses(folder: Path) -> tuple:
    with sqlite3.connect(folder / "exp.db") as db:
        run = db.execute("SELECT status, step FROM runs WHERE name = ?", (NAME,)).fetchall()
    if not (folder / "mlflow.db").read_bytes().startswith(b"SQLite format 3"):
        return run, None
    with sqlite3.connect(folder / "mlflow.db") as db:
        return run, db.execute("SELECT status, end_time FROM runs").fetchall()


def _set_revision(value: str):
    def damage(folder: Path) -> None:
        with sqlite3.connect(folder / "exp.db") as db:
            db.execute("UPDATE alembic_version SET version_num = ?", (value,))
    return damage


def _other_data(folder: Path) -> None:
    shutil.copy(ROOT / "exgrpo_core/data/datasets/tiny-arith-test.jsonl", folder / "other.jsonl")


CASES = {  # name: (damage, overrides, what the line must say)
    "dataset changed": (_other_data, ["data.train_path={folder}/other.jsonl"],
                        "the dataset of run finished changed since it started"),
    "group size changed": (None, ["rollout.group_size=4"], "trained with rollout.group_size=8, this command sets 4"),
    "future schema revision": (_set_revision("9999_from_the_future"), [],
                               "schema revision '9999_from_the_future', which this ExGRPO does not know"),
    "foreign schema revision": (_set_revision("ae1027a6acf"), [], "schema revision 'ae1027a6acf'"),
    "mlflow.db replaced by junk": (lambda f: (f / "mlflow.db").write_bytes(b"junk" * 100), [],
                                   "is not an SQLite database"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_leaves_a_finished_run_as_it_was(case, finished, tmp_path):
    damage, sets, named = CASES[case]
    folder = tmp_path / "copy"
    shutil.copytree(finished, folder)
    if damage:
        damage(folder)
    before = _statuses(folder)
    assert before[0] == [("finished", 1)], before
    rc, out = _train(folder, ["run.steps=4", *(s.format(folder=folder) for s in sets)],
                     prefect_api="http://127.0.0.1:9/api")
    assert one_early_line(rc, out), f"{case}: rc {rc}\n{out[-3000:]}"
    assert named in out, out
    assert _statuses(folder) == before
