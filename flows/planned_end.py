"""Planned ends of a training flow run as Prefect shows them: a grey Cancelled state named for the reason
(`AlreadyFinished`: nothing to train; `Stopped`: a monitor's checkpoint_and_stop; `Cancelled`: a Cancel from
the UI or `prefect flow-run cancel`), one line saying why.

Prefect's engine re-raises a Cancelled flow's outcome on its way out of a worker's process and logs it to
the flow run as ERROR "Engine execution exited with unexpected exception" with its traceback
(`prefect.flow_engine.run_flow`); `quiet_planned_ends` drops that one record when the exception is a
`PlannedEnd`. Every other error is logged as before.

A Cancel: the worker sets Cancelling, then SIGTERMs the flow's process; the flow records the run killed and
ends its flow run Cancelled itself (`cancel_requested`), at once, instead of leaving Prefect's engine to log
"Finished in state Running()" (or "Crash detected!" without the worker's cancel intent) and the worker to
show Cancelling until it has loaded the flow again for its hooks. The task run the SIGTERM interrupted
logs "Crash detected!" too: `quiet_planned_ends` drops that record when the worker's intent was a cancel.
"""

from __future__ import annotations

import logging

from flows.quiet import quiet

# the loggers Prefect's engine reports an attempt's exception on (the flow run's log, the process's)
ENGINE_LOGGERS = ("prefect.flow_runs", "prefect.engine")


class PlannedEnd(RuntimeError):
    """A run that ended as planned, not by an error; the message is the line the user reads."""


def planned_state(name: str, end: PlannedEnd):
    """The flow run's final state for a planned end: Cancelled (grey), named, the end as its data (so an
    in-process caller of the flow gets `end` raised, as before)."""
    from prefect.states import Cancelled

    return Cancelled(name=name, message=str(end), data=end)


class BadParameters(PlannedEnd):
    """The flow run's parameters give no config that runs (a bad override from the form); the one line says
    which. The flow run ends Failed, without a traceback."""


def failed_state(end: BadParameters):
    """Failed, named `BadParameters`, its one line as the message (an in-process caller gets `end` raised)."""
    from prefect.states import Failed

    return Failed(name="BadParameters", message=str(end), data=end)


class CancelledEnd(PlannedEnd):
    """A Cancel stopped the run (the UI's button, `prefect flow-run cancel`); the line says what was recorded."""


def _cancel_intent() -> bool:
    """The worker told this process, before its SIGTERM, that it cancels the flow run (Prefect's control channel)."""
    try:
        from prefect._internal.control_listener import get_intent
    except ImportError:  # a Prefect without the channel: the flow run's state still tells
        return False
    return get_intent() == "cancel"


def cancel_requested(e: BaseException) -> bool:
    """`e` is the SIGTERM of a Cancel of this process's flow run: the worker's intent, else the flow run's state on
    the server is Cancelling (asked only after a SIGTERM: a Ctrl-C never waits on the server)."""
    from prefect.exceptions import TerminationSignal

    seen: set[int] = set()
    while e is not None and not isinstance(e, TerminationSignal) and id(e) not in seen:
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    if not isinstance(e, TerminationSignal):
        return False
    if _cancel_intent():
        return True
    from prefect import get_client
    from prefect.runtime import flow_run

    run_id = flow_run.get_id()
    if not run_id:
        return False
    try:
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(run_id).state
    except Exception:  # noqa: BLE001 (the server is gone: the end is reported as before)
        return False
    return bool(state and state.is_cancelling())


def _is_planned_end(record: logging.LogRecord) -> bool:
    exc = record.exc_info[1] if record.exc_info else None
    return isinstance(exc, PlannedEnd) and record.levelno >= logging.ERROR


def _is_cancelled_task_crash(record: logging.LogRecord) -> bool:
    return (record.levelno >= logging.ERROR and record.getMessage().startswith("Crash detected!")
            and _cancel_intent())


def quiet_planned_ends() -> None:
    """Keep the engine's exit traceback of a planned end, and a cancelled task run's crash line, out of the flow
    run's log (idempotent)."""
    quiet(ENGINE_LOGGERS, _is_planned_end)
    quiet(("prefect.task_runs",), _is_cancelled_task_crash)
