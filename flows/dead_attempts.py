"""Flow runs of a run whose process died without telling Prefect (a SIGKILL, a lost machine): Crashed.

Nothing is left to move such a flow run out of Running when no worker watched its process (`exgrpo
train` runs its flow in its own process). Each attempt that holds a run's lock records its flow run
(id, pid, host) in the run folder (`flow_runs.json`); the next attempt, once it holds the lock, knows
the earlier ones are dead and marks each one Prefect still shows unfinished Crashed (a Cancelling one
Cancelled), saying why. An attempt whose process is still alive on this host (it released the lock and
is finishing) is left to end itself; one the API cannot reach now stays listed for the next start.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

FILE = "flow_runs.json"
_KEEP = 32  # attempts listed at most


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read(path: Path) -> list[dict]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return [e for e in data if isinstance(e, dict) and e.get("id")] if isinstance(data, list) else []


def _write(path: Path, entries: list[dict]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(entries[-_KEEP:], indent=1) + "\n")
    os.replace(tmp, path)


def _end(client, entry: dict, run_name: str) -> str | None:
    """Move the dead attempt's flow run to Crashed (Cancelled when it was Cancelling) when Prefect still
    shows it unfinished; returns the new state's name (None: it had ended)."""
    from prefect.client.schemas.objects import StateType
    from prefect.states import Cancelled, Crashed

    flow_run = client.read_flow_run(entry["id"])
    kind = flow_run.state.type if flow_run.state else None
    if kind not in (StateType.RUNNING, StateType.PENDING, StateType.CANCELLING):
        return None
    why = (f"its process (pid {entry.get('pid')} on {entry.get('host')}) died without ending it: run "
           f"'{run_name}' was started again and found the run's lock free")
    state = Cancelled(message=why) if kind == StateType.CANCELLING else Crashed(message=why)
    client.set_flow_run_state(entry["id"], state, force=True)
    return state.name


def end_dead_attempts(run_dir: Path, run_name: str, flow_run_id) -> list[tuple[str, str]]:
    """Call holding the run's lock: end the earlier attempts' unfinished flow runs (see the module) and
    record this one. Returns (flow run id, new state) per flow run moved. Never raises: a warning line."""
    from prefect import get_client

    path = Path(run_dir) / FILE
    me = {"id": str(flow_run_id), "pid": os.getpid(), "host": socket.gethostname()} if flow_run_id else None
    left, moved = [], []
    entries = [e for e in _read(path) if not me or e["id"] != me["id"]]  # a Retry is the same flow run
    try:
        with get_client(sync_client=True) as client:
            for entry in entries:
                if entry.get("host") == socket.gethostname() and _alive(int(entry.get("pid") or 0)):
                    left.append(entry)  # still finishing after it released the lock
                    continue
                try:
                    state = _end(client, entry, run_name)
                except Exception as e:  # noqa: BLE001 - unknown to this API (another server), or unreachable
                    if type(e).__name__ != "ObjectNotFound":
                        left.append(entry)
                    continue
                if state:
                    moved.append((entry["id"], state))
    except Exception as e:  # noqa: BLE001 - the run trains even when Prefect cannot be told
        print(f"warning: could not end earlier flow runs of run '{run_name}': {str(e).strip()[:200]}")
        left = entries
    try:
        _write(path, left + ([me] if me else []))
    except OSError as e:
        print(f"warning: could not record flow run {flow_run_id} in {path}: {e}")
    for fid, state in moved:
        print(f"flow run {fid} of an earlier attempt of run '{run_name}' marked {state}: its process had died")
    return moved
