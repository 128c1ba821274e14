"""Planned ends of a training flow run as Prefect shows them: a grey Cancelled state named for the reason
(`AlreadyFinished`: nothing to train; `Stopped`: a monitor's checkpoint_and_stop), one line saying why.

Prefect's engine re-raises a Cancelled flow's outcome on its way out of a worker's process and logs it to
the flow run as ERROR "Engine execution exited with unexpected exception" with its traceback
(`prefect.flow_engine.run_flow`); `quiet_planned_ends` drops that one record when the exception is a
`PlannedEnd`. Every other error is logged as before.
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


def _is_planned_end(record: logging.LogRecord) -> bool:
    exc = record.exc_info[1] if record.exc_info else None
    return isinstance(exc, PlannedEnd) and record.levelno >= logging.ERROR


def quiet_planned_ends() -> None:
    """Keep the engine's exit traceback of a planned end out of the flow run's log (idempotent)."""
    quiet(ENGINE_LOGGERS, _is_planned_end)
