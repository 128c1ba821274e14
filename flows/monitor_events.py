"""Report replay-health monitor firings (exgrpo_core/observe/monitors.py) and carry out their actions.

Called by the training flow after each step's metrics are logged. Every firing becomes:
- a Prefect event `exgrpo.monitor.<name>` on the resource `exgrpo.run.<run id>` (related: the flow
  run), so Prefect automations can notify, pause or cancel on it (docs/monitors.md);
- an MLflow metric `monitor/<name>` at the step and a tag `exgrpo.monitor.<name>` (the last message);
- a warning line in the CLI / flow log;
- a stored step metric `monitor/<name>` (the dashboard's banner on the Runs and Buffer pages).
A `checkpoint_and_stop` firing then writes a checkpoint and raises `MonitorStop`: the flow records the
run as `stopped` (MLflow: FAILED with tag `exgrpo.stopped_by`; Prefect: Cancelled "Stopped", a planned
end, flows/planned_end.py), the CLI prints one line and exits 3.
"""

from __future__ import annotations

from prefect.events import emit_event
from prefect.logging import get_run_logger

from exgrpo_core import loop
from exgrpo_core.observe.monitors import Firing
from exgrpo_core.run import checkpoint
from exgrpo_core.run.session import Session
from flows.planned_end import PlannedEnd
from flows.tracking import MlflowRun

EVENT_PREFIX = "exgrpo.monitor."


class MonitorStop(PlannedEnd):
    """A monitor whose action is checkpoint_and_stop fired; the run was checkpointed and stopped."""


def resource_id(run_id: str) -> str:
    """The Prefect resource every event of one run concerns (match it in an automation's trigger)."""
    return f"exgrpo.run.{run_id}"


def emit(s: Session, f: Firing):
    """One Prefect event for a firing; returns the event (None when Prefect does not emit events)."""
    related = []
    try:
        from prefect.runtime import flow_run

        if flow_run.id:
            related.append({"prefect.resource.id": f"prefect.flow-run.{flow_run.id}",
                            "prefect.resource.role": "flow-run", "prefect.resource.name": flow_run.name or ""})
    except Exception:  # noqa: BLE001 - outside a flow run there is nothing to relate
        pass
    return emit_event(
        event=EVENT_PREFIX + f.name,
        resource={"prefect.resource.id": resource_id(s.run_id), "prefect.resource.name": s.cfg.run.name,
                  "exgrpo.monitor": f.name, "exgrpo.action": f.action},
        related=related,
        payload={"step": f.step, "value": f.value, "limit": f.limit, "side": f.side, "action": f.action,
                 "message": f.message(), "mlflow_run_id": s.mlflow_run_id})


def report(s: Session, tracker: MlflowRun, step: int, stats: dict) -> list[Firing]:
    """Check the step's monitors, report every firing, and stop the run when one asks to."""
    fired = loop.check_monitors(s, step, stats)  # stores monitor/<name> at the step
    if not fired:
        return fired
    logger = get_run_logger()
    tracker.log_metrics({f.key: f.value for f in fired}, step)
    _tag(tracker, {f"exgrpo.monitor.{f.name}": f.message() for f in fired})
    for f in fired:
        logger.warning(f.message())
        emit(s, f)
    stop = [f for f in fired if f.stops]
    if stop:
        done = checkpoint.latest_checkpoint(s.run_dir)
        if done is None or done.name != checkpoint.folder_name(step):
            s.save()  # s.step is already step + 1: this checkpoints the completed step
        _tag(tracker, {"exgrpo.stopped_by": stop[0].message()})
        _deliver_events()  # the run ends next: the stop's event must reach the API first
        raise MonitorStop(f"{stop[0].message()}; checkpoint {checkpoint.folder_name(step)} written, "
                          "rerun the same command "
                          f"to resume (after fixing the cause or monitors.{stop[0].name})")
    return fired


def _deliver_events(timeout_s: float = 30.0) -> None:
    """Wait until the queued events are sent (Prefect sends them from a background worker)."""
    from prefect.events.worker import EventsWorker

    try:
        EventsWorker.drain_all(timeout=timeout_s)
    except Exception as e:  # noqa: BLE001 - a lost event must not hide the stop
        get_run_logger().warning(f"monitor events may not have reached Prefect: {e}")


def _tag(tracker: MlflowRun, tags: dict[str, str]) -> None:
    client = tracker.mlflow.MlflowClient()
    for k, v in tags.items():
        client.set_tag(tracker.run_id, k, v)
