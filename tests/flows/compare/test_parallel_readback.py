"""`compare --parallel` after a sequential compare of the same name, on a real Prefect server.

The sequential compare trains 2 arms x 1 seed (tiny, 2 steps) in-process. The same comparison run with
`--parallel` then finds both children finished in the experience database and reads them back: nothing
is submitted (the deployment's pool has no worker, so a submitted child would never run) and the table
is the sequential one's. Widened to a second seed whose two new children are cancelled while they wait,
the comparison fails (exit 2) and its report goes to `incomplete/`: the report of finished children, on
disk and in the MLflow parent run, stays as it was.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]


def _rows(path: Path) -> dict:
    with open(path) as f:
        return {(r["arm"], r["seed"]): {k: v for k, v in r.items() if k != "status"} for r in csv.DictReader(f)}


def _artifact(key: str) -> str:
    """The latest markdown artifact of this key."""
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter
    from prefect.client.schemas.sorting import ArtifactSort

    with get_client(sync_client=True) as client:
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(key={"any_": [key]}), sort=ArtifactSort.CREATED_DESC)
    assert arts, f"no artifact {key}"
    return arts[0].data


def _deployment(url: str) -> str:
    """A deployment of exgrpo-train on a process pool that no worker serves."""
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    pool = f"rb-{uuid.uuid4().hex[:6]}"
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
        client.create_deployment(client.create_flow_from_name("exgrpo-train"), f"d-{pool}", work_pool_name=pool)
    return f"exgrpo-train/d-{pool}"


def _cancel_new_children(name: str, n: int, proc: subprocess.Popen, timeout: float = 300) -> list[str]:
    """Wait until the parent submitted n children, then cancel them (the UI's Cancel of a queued run)."""
    from prefect import get_client
    from prefect.states import Cancelled

    from flows.compare.parallel import find_children

    deadline = time.time() + timeout
    with get_client(sync_client=True) as client:
        while time.time() < deadline and proc.poll() is None:
            found = find_children(client, name)
            if len(found) >= n:
                for runs in found.values():
                    client.set_flow_run_state(runs[-1].id, Cancelled(message="cancelled in the UI"), force=True)
                return sorted(found)
            time.sleep(1)
    raise AssertionError(f"the parent never submitted {n} children (exit {proc.poll()})")


def _run_cancelling_new_children(cmd: list[str], env: dict, name: str, n: int) -> tuple[int, str, list[str]]:
    """Run `cmd`, cancel the n children it submits; (exit code, output, the cancelled children's names)."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    cancelled = _cancel_new_children(name, n, proc)
    out, _ = proc.communicate(timeout=400)
    return proc.returncode, out, cancelled


def test_parallel_reads_back_a_sequential_compare_and_a_failed_one_keeps_its_report(tmp_path, prefect_server):
    import mlflow

    from flows.compare.flow import compare

    name = f"rb{uuid.uuid4().hex[:6]}"
    sets = ["run.steps=2", f"run.output_dir={tmp_path / 'runs'}", f"run.db_url=sqlite:///{tmp_path / 'exp.db'}",
            f"run.mlflow_tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}"]
    seq = compare(preset="tiny", overrides=sets, arms=["on_policy", "exgrpo"], seeds=[0], evaluate=False, name=name)
    report = Path(seq["files"]["csv"])
    before = _rows(report)

    deployment = _deployment(prefect_server)
    cmd = [sys.executable, "-m", "flows.cli", "compare", "--config", "tiny", "--arms", "on_policy,exgrpo",
           "--name", name, "--no-eval", "--parallel", "--deployment", deployment,
           *sum((["--set", s] for s in sets), [])]
    env = {**os.environ, "PREFECT_API_URL": prefect_server}
    par = subprocess.run([*cmd, "--seeds", "0"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    out = par.stdout + par.stderr
    assert par.returncode == 0, out[-4000:]
    assert "2 found (2 finished in the database), 0 to submit" in out, out[-4000:]
    assert _rows(report) == before  # the same children, read back
    with open(report) as f:
        assert {r["status"] for r in csv.DictReader(f)} == {"finished"}
    good_md = Path(seq["files"]["md"]).read_text()
    assert "2 of 2 children were read back from the experience database, trained before outside the " \
        "deployment" in good_md and "ran as flow runs" not in good_md  # where they came from, not a claim
    assert _artifact(f"exgrpo-{name}-comparison") == good_md  # the table in Prefect, not a log line

    code, out, cancelled = _run_cancelling_new_children([*cmd, "--seeds", "0-1"], env, name, 2)
    assert code == 2, out[-4000:]
    assert "2 of 4 children did not finish" in out and "incomplete" in out, out[-4000:]
    assert cancelled == [f"{name}-exgrpo-s1", f"{name}-on_policy-s1"]
    assert _rows(report) == before and Path(seq["files"]["md"]).read_text() == good_md
    with open(report.parent / "incomplete" / report.name) as f:
        marked = {(r["arm"], r["seed"]): r["status"] for r in csv.DictReader(f)}
    assert marked[("on_policy", "1")] == "cancelled" and marked[("exgrpo", "0")] == "finished", marked
    assert _artifact(f"exgrpo-{name}-comparison") == good_md and "cancelled" in _artifact(f"exgrpo-{name}-incomplete")

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    tags = client.get_run(seq["parent_mlflow_run_id"]).data.tags  # where the comparison came from
    assert tags["prefect.flow_run_id"] in tags["prefect.flow_run_url"] and tags["mlflow.source.git.commit"]
    assert f"compare --config tiny --arms on_policy,exgrpo --name {name}" in tags["exgrpo.command"], tags
    md = client.download_artifacts(seq["parent_mlflow_run_id"], Path(seq["files"]["md"]).name, str(tmp_path / "dl"))
    assert Path(md).read_text() == good_md, "the failed comparison replaced the parent run's report"


def test_a_child_flow_run_that_ends_already_finished_counts_as_finished():
    from types import SimpleNamespace

    from prefect.client.schemas.objects import StateType

    from flows.compare.parallel import status

    def run(kind, name):
        return SimpleNamespace(state_type=kind, state_name=name)

    assert status(run(StateType.CANCELLED, "AlreadyFinished")) == "finished"  # trained by an earlier compare
    assert status(run(StateType.CANCELLED, "Cancelled")) == "cancelled"
    assert status(run(StateType.CANCELLED, "Stopped")) == "cancelled"  # a monitor stopped it: not finished
