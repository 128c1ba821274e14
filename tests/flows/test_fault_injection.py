"""Fault injection in the suite (issue 16): a tiny `exgrpo train` (SQLite, Prefect's ephemeral API,
checkpoint every step) SIGKILLed at random moments, one of them during a checkpoint write, and rerun
until it finishes, ends exactly where an uninterrupted run does: the same weights and optimiser, every
experience row, one MLflow point per (metric, step), one finished run, and no process of a killed
command left alive. The same with rollout.overlap=1 (issue 47): random kills, and a kill while a checkpoint
waits for the batch sampled ahead. A few trials here; `benchmarks/reliability/fault_injection.py` runs many."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from benchmarks.reliability import fault_injection as fi  # noqa: E402

pytestmark = pytest.mark.slow
STEPS = 4


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run, its duration and its end state; the Prefect home shared by the trials."""
    work = tmp_path_factory.mktemp("fault-injection")
    env, duration, ref = fi.reference_run(work, STEPS)
    return work, env, duration, ref


@pytest.fixture(scope="module")
def overlap_reference(tmp_path_factory):
    """An uninterrupted rollout.overlap=1 run, as `reference`."""
    work = tmp_path_factory.mktemp("fault-injection-overlap")
    env, duration, ref = fi.reference_run(work, STEPS, overlap=1)
    return work, env, duration, ref


def _trial(reference, name: str, kills, overlap: int = 0, slow_sampler_s: float = 0.0):
    work, env, _, ref = reference
    root = work / name
    root.mkdir()
    db = fi.db_for("sqlite", root)
    cmd = fi.train_command(root, db, STEPS, overlap=overlap, slow_sampler_s=slow_sampler_s)
    run = fi.run_until_done(cmd, env, root, kills)
    assert run["finished"], run["failures"]
    return run, fi.compare(ref, fi.final_state(root, db))


def _check(run, diff, kills_expected: int):
    assert len(run["kills"]) == kills_expected, run["kills"]
    assert not run["leaked"], f"processes outlived the killed `exgrpo train`: {run['leaked']}"
    assert diff["weights_equal"], "the resumed run's weights or optimiser differ from the uninterrupted run's"
    assert (diff["rows_lost"], diff["rows_extra"]) == (0, 0), (diff["lost_by_table"], diff["first_differences"])
    assert (diff["duplicate_points"], diff["missing_points"], diff["extra_points"]) == (0, 0, 0), diff
    assert diff["mlflow_runs"] == 1, f"a resume started another MLflow run: {diff['mlflow_runs']} runs"
    assert diff["orphaned_runs"] == 0 and diff["exact"], diff


def test_killed_during_a_checkpoint_write_and_at_a_random_moment(reference):
    rng = random.Random(16)
    _, _, duration, _ = reference
    kills = [("checkpoint", 1), ("time", round(rng.uniform(0.1, 0.5) * duration, 2))]
    run, diff = _trial(reference, "ckpt", kills)
    assert run["kills"][0]["kind"] == "checkpoint"
    _check(run, diff, kills_expected=2)


def test_killed_right_after_a_checkpoint_is_committed(reference):
    """The moment `step_N` is renamed into place: the resumed run starts after that step, so its metrics,
    monitor values, perf/checkpoint_s and pictures must all have been recorded before the rename."""
    run, diff = _trial(reference, "committed", [("committed", 1), ("committed", 2)])
    _check(run, diff, kills_expected=2)
    work, _, _, _ = reference
    import mlflow

    root = work / "committed"
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    (mlflow_run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    plots = {Path(a.path).name for a in client.list_artifacts(mlflow_run.info.run_id, "plots")}
    assert plots == {f"step_{s:06d}" for s in range(1, STEPS + 1)}, plots  # checkpoint_every=1: pictures every step


def test_killed_at_start_up(reference):
    """Before the first checkpoint (Prefect and the model still starting): the rerun continues the same run."""
    run, diff = _trial(reference, "startup", [("time", 3.0)])
    _check(run, diff, kills_expected=1)


def test_the_comparison_sees_a_lost_row_and_a_duplicated_point(reference):
    """The harness itself: a state with one experience row fewer and one MLflow point twice is not exact."""
    from collections import Counter

    _, _, _, ref = reference
    rows = {t: Counter(c) for t, c in ref["rows"].items()}
    rows["trajectories"].subtract([next(iter(rows["trajectories"]))])
    rows["trajectories"] += Counter()  # drop the zero count
    points = Counter(ref["mlflow"]["points"])
    points[next(iter(points))] += 1
    diff = fi.compare(ref, {**ref, "rows": rows, "mlflow": {**ref["mlflow"], "points": points}})
    assert diff["rows_lost"] == 1 and diff["duplicate_points"] == 1 and not diff["exact"]


def _versions(ref) -> set[tuple[int, int]]:
    return {(dict(r)["collected_step"], dict(r)["step"]) for r in ref["rows"]["trajectories"].elements()}


def test_overlap_run_killed_while_a_checkpoint_waits_for_the_batch_in_flight_and_at_a_random_moment(
        overlap_reference):
    """rollout.overlap=1 through slow_sampler.py (each batch sampled ahead is held until its checkpoint waits for
    it, then sampled; holding draws no random number): SIGKILLed while step 1's checkpoint waits for step 2's
    batch, still being sampled, then at a random moment; each rerun resumes from a checkpoint holding the next
    step's batch and trains on exactly those rollouts. The end state is the uninterrupted (plain) run's: the
    weights, every row (the trajectories' step, the sampling policy version, and collected_step), one MLflow run
    with one point per (metric, step), no leaked process."""
    _, _, duration, ref = overlap_reference
    assert _versions(ref) == {(0, 0)} | {(t, t - 1) for t in range(1, STEPS)}  # the rows compared carry versions
    rng = random.Random(47)
    kills = [("in_flight", 1), ("time", round(rng.uniform(0.4, 0.8) * duration, 2))]
    run, diff = _trial(overlap_reference, "overlap", kills, overlap=1, slow_sampler_s=1.0)
    assert run["kills"][0]["batch_in_flight"], run["kills"]  # the sampler thread was still running
    assert not run["kills"][0]["in_checkpoint_write"]  # killed in the wait, before any checkpoint file
    _check(run, diff, kills_expected=2)


PARENT = """import multiprocessing as mp, time
def sleep():
    time.sleep(120)
if __name__ == "__main__":
    p = mp.get_context("spawn").Process(target=sleep, name="exgrpo-overlap-sampler", daemon=True)
    p.start()
    print(p.pid, flush=True)
    time.sleep(120)
"""


def test_the_leak_check_sees_a_spawned_child_that_outlives_its_killed_parent(tmp_path):
    """The harness itself: a spawned multiprocessing child (as rollout.overlap_sampler=process starts), here
    without the lifeline, is in the killed command's session, so it is reported as leaked (and killed)."""
    import signal
    import subprocess

    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, start_new_session=True)
    child = int(proc.stdout.readline())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    leaked = fi.leaked_after_kill(proc.pid, within_s=2)
    assert any(line.split()[0] == str(child) and "spawn_main" in line for line in leaked), leaked
    assert child not in fi.session_processes(proc.pid)  # the check killed it
