"""A SIGKILLed `exgrpo train` leaves its Prefect flow run Running; the next start of that run, holding the
run's lock, marks it Crashed (flows/dead_attempts.py), through Prefect's ephemeral API as `exgrpo train`
starts it, and leaves alone the flow runs that ended or whose process still lives."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows.dead_attempts import FILE, end_dead_attempts

ROOT = Path(__file__).resolve().parents[2]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_only_unfinished_flow_runs_of_dead_attempts_are_ended(tmp_path, prefect_server):
    from prefect import flow, get_client
    from prefect.client.schemas.objects import StateType
    from prefect.states import Cancelling, Completed, Running

    @flow(name="dead-attempts-probe")
    def probe():
        pass

    with get_client(sync_client=True) as client:
        ids = {k: client.create_flow_run(probe, state=st).id for k, st in (
            ("dead", Running()), ("cancelling", Cancelling()), ("ended", Completed()), ("alive", Running()))}
        dead = _dead_pid()
        here = os.uname().nodename
        entries = [{"id": str(ids[k]), "pid": pid, "host": here} for k, pid in (
            ("dead", dead), ("cancelling", dead), ("ended", dead), ("alive", os.getpid()))]
        entries.append({"id": "00000000-0000-4000-8000-000000000000", "pid": dead, "host": here})  # not on this API
        (tmp_path / FILE).write_text(json.dumps(entries))
        me = "11111111-0000-4000-8000-000000000000"
        moved = end_dead_attempts(tmp_path, "r", me)
        states = {k: client.read_flow_run(i).state for k, i in ids.items()}
    assert sorted(moved) == sorted([(str(ids["dead"]), "Crashed"), (str(ids["cancelling"]), "Cancelled")])
    assert states["dead"].type == StateType.CRASHED
    assert states["dead"].message.startswith(f"its process (pid {dead} on {here}) died without ending it: run 'r'")
    assert states["cancelling"].type == StateType.CANCELLED
    assert states["ended"].type == StateType.COMPLETED and states["alive"].type == StateType.RUNNING
    listed = [e["id"] for e in json.loads((tmp_path / FILE).read_text())]
    assert listed == [str(ids["alive"]), me]  # the live one is looked at again next time; this attempt recorded
    assert end_dead_attempts(tmp_path, "r", me) == []  # a Retry of the same flow run: nothing to end


def _env(tmp_path: Path) -> dict:
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home")}
    env.pop("PREFECT_API_URL", None)  # Prefect's ephemeral API, as `exgrpo train` starts it by default
    return env


READ_STATES = """
import json
from flows.prefect_api import serve_prefect_api
serve_prefect_api()
from prefect import get_client
with get_client(sync_client=True) as client:
    runs = client.read_flow_runs()
print("STATES " + json.dumps({str(r.id): [r.state.type.value, r.state.message] for r in runs}))
"""


@pytest.mark.slow
def test_a_killed_train_commands_flow_run_is_crashed_by_the_next_start(tmp_path, tiny_overrides):
    env = _env(tmp_path)
    args = [sys.executable, "-m", "flows.cli", "train", "--config", "tiny", *sum((["--set", o] for o in [
        *tiny_overrides, "run.name=k", "run.steps=4", "run.checkpoint_every=1"]), [])]
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    record, deadline = tmp_path / "runs" / "k" / FILE, time.time() + 600
    while time.time() < deadline:
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        try:
            conn = sqlite3.connect(f"file:{tmp_path / 'exp.db'}?mode=ro", uri=True, timeout=30)
            step = conn.execute("SELECT max(step) FROM group_results").fetchone()[0]
            conn.close()
        except sqlite3.Error:
            step = None
        if step is not None and step >= 1:
            break
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()

    again = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    read = subprocess.run([sys.executable, "-c", READ_STATES], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    (line,) = [x for x in read.stdout.splitlines() if x.startswith("STATES ")] or [read.stdout + read.stderr]
    states = json.loads(line.removeprefix("STATES "))
    assert sorted(t for t, _ in states.values()) == ["COMPLETED", "CRASHED"], states  # not left RUNNING
    second = json.loads(record.read_text())[-1]["id"]
    (killed,) = set(states) - {second}
    assert states[killed][0] == "CRASHED" and "died without ending it" in states[killed][1], states
    assert states[second][0] == "COMPLETED", states
    out = again.stdout + again.stderr  # Prefect's log lines go to stderr
    assert f"flow run {killed} of an earlier attempt of run 'k' marked Crashed: its process had died" in out, out
