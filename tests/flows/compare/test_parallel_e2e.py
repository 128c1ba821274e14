"""End to end: `exgrpo compare --parallel` on a real Prefect server, a process work pool served by two
workers, and a scratch PostgreSQL experience database.

2 arms x 2 seeds of the tiny preset (6 steps) with a queue limit of 2 slots: the children are flow runs of
the `exgrpo-train` deployment (deployed from prefect.yaml with `prefect deploy --pool`). The parent is
killed once workers took children and started again: it finds its 4 children and submits none; a child
cancelled while it waits for a slot is reported as cancelled (exit 2, one line); `--retry-failed` then
resubmits that child alone. The children's slot times (taken by a worker to ended) overlap, never more
than 2 at once. Before that, a quick check of the deployment, pool and queue the parent is pointed at (no
worker needed).
"""

from __future__ import annotations

import csv
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from exgrpo_core.store.engine import scratch_postgres_database
from exgrpo_core.store.experience_store import ExperienceStore

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]
PG_URL = os.environ.get("EXGRPO_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
SLOTS = 2


@pytest.fixture
def pool(prefect_server, tmp_path):
    """A process work pool with the exgrpo-train deployment and two workers; yields (pool, env)."""
    name = f"par-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "PREFECT_API_URL": prefect_server, "EXGRPO_REPO_DIR": str(ROOT), "PYTHONPATH": str(ROOT),
           "PREFECT_WORKER_QUERY_SECONDS": "2", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    prefect = [sys.executable, "-m", "prefect"]
    subprocess.run([*prefect, "work-pool", "create", name, "--type", "process"], env=env, check=True,
                   capture_output=True, timeout=120)
    deploy = subprocess.Popen([*prefect, "--no-prompt", "deploy", "--name", "exgrpo-train", "--pool", name],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    workers = [subprocess.Popen([*prefect, "worker", "start", "--pool", name, "--type", "process", "--name",
                                 f"{name}-w{i}"], cwd=tmp_path, env=env, stdout=open(tmp_path / f"worker{i}.log", "w"),
                                stderr=subprocess.STDOUT, start_new_session=True) for i in range(2)]
    try:
        out, _ = deploy.communicate(timeout=300)
        assert deploy.returncode == 0, out[-3000:]
        yield name, env
    finally:
        for w in workers:  # the worker and the flow processes it started
            try:
                os.killpg(w.pid, signal.SIGTERM)
                w.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(w.pid, signal.SIGKILL)


def _client(url: str):
    from prefect import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: url}):
        return get_client(sync_client=True)


def _children(url: str, name: str) -> dict[str, list]:
    from flows.compare.parallel import find_children

    with _client(url) as client:
        return find_children(client, name)


def _wait_taken(url: str, name: str, n: int, timeout: float = 300) -> dict[str, list]:
    """The children once all n exist and a worker took one (pending or running)."""
    from flows.compare.parallel import status

    deadline = time.time() + timeout
    while time.time() < deadline:
        found = _children(url, name)
        if len(found) == n and any(status(runs[-1]) in ("pending", "running") for runs in found.values()):
            return found
        time.sleep(1)
    raise AssertionError(f"children of {name} never started: {_children(url, name)}")


def _slot_spans(url: str, runs: list) -> list[tuple]:
    """(taken, ended) of each flow run: from its first Pending state (a worker took it, the slot is held) to its end.

    Running times alone can miss the overlap: a child's ~7 s of training is short beside the ten seconds or
    more its process takes to start on a loaded machine, which is slot time too.
    """
    with _client(url) as client:
        taken = [min((s.timestamp for s in client.read_flow_run_states(r.id) if s.type.value == "PENDING"),
                     default=r.start_time) for r in runs]
    return [(t, r.end_time) for t, r in zip(taken, runs)]


def _rows(md_dir: Path, name: str) -> dict[tuple[str, str], dict]:
    with open(md_dir / name / f"compare_{name}.csv") as f:
        return {(r["arm"], r["seed"]): r for r in csv.DictReader(f)}


def test_the_deployment_and_pool_are_checked_and_the_queue_gets_the_slots(prefect_server):
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.compare.parallel import ParallelError, Target, prepare

    pool = f"chk-{uuid.uuid4().hex[:6]}"
    with temporary_settings(updates={PREFECT_API_URL: prefect_server}), _client(prefect_server) as client:
        client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
        client.create_deployment(client.create_flow_from_name("exgrpo-train"), f"d-{pool}", work_pool_name=pool)
        dep = f"exgrpo-train/d-{pool}"
        with pytest.raises(ParallelError, match="no deployment exgrpo-train/nope on the Prefect server"):
            prepare(Target(deployment="exgrpo-train/nope"))
        with pytest.raises(ParallelError, match=f"runs on work pool {pool}, not other: `prefect deploy"):
            prepare(Target(deployment=dep, pool="other"))
        assert prepare(Target(deployment=dep, pool=pool, queue="gpus", slots=3)) == pool  # created with the limit
        assert client.read_work_queue_by_name("gpus", work_pool_name=pool).concurrency_limit == 3
        prepare(Target(deployment=dep, queue="gpus", slots=1))
        prepare(Target(deployment=dep, queue="gpus"))  # no --slots: the queue's limit stays
        assert client.read_work_queue_by_name("gpus", work_pool_name=pool).concurrency_limit == 1


@pytest.mark.postgres
def test_parallel_children_overlap_survive_a_parent_restart_and_report_a_cancelled_child(pool, tmp_path):
    from flows.compare.parallel import status

    pool_name, env = pool
    url, name, runs_dir = env["PREFECT_API_URL"], f"par{uuid.uuid4().hex[:6]}", tmp_path / "runs"
    with scratch_postgres_database(PG_URL, "exgrpo_par") as db_url:
        cmd = [sys.executable, "-m", "flows.cli", "compare", "--config", "tiny", "--arms", "on_policy,exgrpo",
               "--seeds", "0-1", "--name", name, "--parallel", "--pool", pool_name, "--slots", str(SLOTS),
               *sum((["--set", s] for s in ("run.steps=6", f"run.output_dir={runs_dir}", f"run.db_url={db_url}",
                                           f"run.mlflow_tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}")), [])]
        first = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=open(tmp_path / "parent1.log", "w"),
                                 stderr=subprocess.STDOUT)
        try:
            found = _wait_taken(url, name, 4)
        finally:
            first.kill()  # the parent dies mid-way; its children go on
            first.wait()
        assert set(found) == {f"{name}-{a}-s{s}" for a in ("on_policy", "exgrpo") for s in (0, 1)}
        for child, (run,) in found.items():  # parameterised and tagged with the comparison, arm and seed
            arm, seed = child[len(name) + 1:].rsplit("-s", 1)
            assert {f"exgrpo-parent:{name}", f"exgrpo-arm:{arm}", f"exgrpo-seed:{seed}"} <= set(run.tags)
            assert run.name == child and f"run.name={child}" in run.parameters["overrides"]
        # a child waiting for a slot is cancelled (a running one's process is stopped by its worker, whose
        # cancellation takes a minute or more on this loaded machine, while its slot is already free)
        cancelled = next(n for n, runs in found.items() if status(runs[-1]) == "scheduled")
        from prefect.client.schemas.objects import State, StateType

        with _client(url) as client:  # what `prefect flow-run cancel` and the UI's Cancel do
            client.set_flow_run_state(found[cancelled][-1].id, State(type=StateType.CANCELLING))

        second = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        out = second.stdout + second.stderr
        assert second.returncode == 2, out[-4000:]
        assert re.search(r"4 found \(\d finished in the database\), 0 to submit", out), out[-4000:]
        assert "1 of 4 children did not finish" in out, out[-4000:]
        after = _children(url, name)
        assert {n: len(r) for n, r in after.items()} == {n: 1 for n in found}  # the restart submitted nothing
        assert status(after[cancelled][-1]) == "cancelled"
        rows = _rows(runs_dir, name)
        for (arm, seed), row in rows.items():
            if seed != "mean":
                want = "cancelled" if f"{name}-{arm}-s{seed}" == cancelled else "finished"
                assert row["status"] == want and (row["responses generated"] == "—") == (want == "cancelled"), row

        # slot times (a worker took the child, then it ended): they overlap, never more than SLOTS at once
        with ExperienceStore(db_url) as store:  # it never trained; the others did, once each
            assert store.find_run_by_name(cancelled) is None
            assert all(store.find_run_by_name(n) for n in found if n != cancelled)
        spans = _slot_spans(url, [r[-1] for n, r in after.items() if n != cancelled])
        assert all(s and e for s, e in spans), spans
        assert any(a[0] < b[1] and b[0] < a[1] for i, a in enumerate(spans) for b in spans[i + 1:]), spans
        assert max(sum(s <= t < e for s, e in spans) for t, _ in spans) <= SLOTS, spans

        third = subprocess.run(cmd + ["--retry-failed"], cwd=ROOT, env=env, capture_output=True, text=True,
                               timeout=600)
        out = third.stdout + third.stderr
        assert third.returncode == 0, out[-4000:]
        assert "4 found (3 finished in the database), 1 to submit" in out, out[-4000:]
        final = _children(url, name)
        assert len(final[cancelled]) == 2 and all(status(r[-1]) == "finished" for r in final.values())
        assert all(len(final[n]) == 1 for n in final if n != cancelled)
        assert {r["status"] for k, r in _rows(runs_dir, name).items() if k[1] != "mean"} == {"finished"}

        import mlflow

        client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
        exp = client.get_experiment_by_name("exgrpo")
        parents = client.search_runs([exp.experiment_id], f"tags.`exgrpo.comparison` = '{name}'")
        assert len(parents) == 1 and parents[0].info.status == "FINISHED"
        nested = client.search_runs([exp.experiment_id], f"tags.`mlflow.parentRunId` = '{parents[0].info.run_id}'")
        assert {c.info.run_name for c in nested if c.info.status == "FINISHED"} == set(found)
