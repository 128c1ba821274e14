"""A service a run depends on failing mid-run (issue 35, item 6): the experience database stops answering,
the MLflow server dies, the disk fills up, rollout.overlap's sampler process dies or its batch runs past
rollout.overlap_timeout_s, the rollout engine's weights differ from the trainer's after a push. The run is recorded failed wherever it still can be
(`flows/train.py` `_record_end`); `exgrpo train` then prints one line naming the service and exits with
`EXIT_CODE`, without a traceback: `quiet_dependency_faults` drops Prefect's task- and flow-failure ERROR
records of such an exception (the line says it all), found by the exception, never by its text. Every
other error is logged as before.
"""

from __future__ import annotations

import errno
import logging
from collections import deque
from pathlib import Path

from rich.console import Console

from exgrpo_core.run.db_guard import DatabaseLostError
from exgrpo_core.run.disk_space import exception_chain as _chain
from flows.quiet import quiet

EXIT_CODE = 4  # `exgrpo train`: a service the run depends on failed (2: a user error, 3: stopped by a monitor)
_LOGGERS = ("prefect.task_runs", "prefect.flow_runs", "prefect.engine")


class DependencyError(RuntimeError):
    """A dependency of a running run failed; the message is the line the user reads (on stderr)."""

    exit_code = EXIT_CODE
    console = Console(stderr=True, highlight=False, soft_wrap=True)  # one line, however narrow the terminal


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _is_damaged(exc: BaseException) -> bool:
    """An SQLite file found damaged by a read or write (malformed, not a database)."""
    from sqlalchemy.exc import DatabaseError

    return type(exc) is DatabaseError and type(getattr(exc, "orig", None)).__module__ == "sqlite3"


def database_lost(exc: BaseException) -> bool:
    """The run's SQLite file is gone, replaced or damaged (its end is not recorded in it)."""
    return any(isinstance(e, DatabaseLostError) or _is_damaged(e) for e in _chain(exc))


def _sqlite_full(exc: BaseException) -> bool:
    """SQLite's SQLITE_FULL (the experience database's or a local MLflow store's disk is full)."""
    import sqlite3

    orig = getattr(exc, "orig", exc)
    return isinstance(orig, sqlite3.OperationalError) and "database or disk is full" in str(orig)


def _is_database(exc: BaseException) -> bool:
    mod = type(exc).__module__
    if mod.startswith("sqlalchemy"):
        from sqlalchemy.exc import InterfaceError, OperationalError

        return _is_damaged(exc) or isinstance(exc, (OperationalError, InterfaceError))
    return mod.startswith("psycopg") and type(exc).__name__ in ("OperationalError", "InterfaceError")


def _is_mlflow(exc: BaseException) -> bool:
    # not a bare requests error: other HTTP services (a remote rollout engine) raise those too
    if not type(exc).__module__.startswith("mlflow"):
        return False
    return type(exc).__name__ == "RestException" or "API request to" in str(exc)  # answered an error / gave up


def _is_sampler(exc: BaseException) -> bool:
    """The overlap sampler process died or failed, or a batch sampled ahead ran past its timeout."""
    return type(exc).__module__.startswith("exgrpo_core.rollout") and type(exc).__name__ in (
        "SamplerProcessError", "OverlapTimeout")


def _is_engine(exc: BaseException) -> bool:
    """A push that did not land: the rollout engine (vLLM, the rollout server, the overlap sampler's copy)
    holds other weights than the trainer's."""
    return any(c.__module__ == "exgrpo_core.rollout.sync" and c.__name__ == "EngineSyncError"
               for c in type(exc).__mro__)  # by name: no torch import on the error path


def kind(exc: BaseException) -> str | None:
    """"database", "mlflow", "disk", "sampler" or "engine" when `exc` (or an exception it was raised from) is that
    dependency failing; None for every other error."""
    for e in _chain(exc):
        if isinstance(e, DependencyError):
            return getattr(e, "kind", None)
        if _is_sampler(e):
            return "sampler"
        if _is_engine(e):
            return "engine"
        if _sqlite_full(e):
            return "disk"
        if isinstance(e, DatabaseLostError) or _is_database(e):
            return "database"
        if _is_mlflow(e):
            return "mlflow"
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return "disk"
    return None


def dependency_error(exc: BaseException, cfg, run_dir: Path, recorded: str) -> DependencyError | None:
    """The one-line error for `exc` when a dependency failed (None otherwise); `recorded` says where the
    run's failure could still be recorded."""
    from exgrpo_core.config.redact import mask_text

    what = kind(exc)
    if what is None:
        return None
    cause = next(e for e in _chain(exc) if kind(e) == what and not isinstance(e, DependencyError))
    lost = next((e for e in _chain(exc) if isinstance(e, DatabaseLostError) or _is_damaged(e)), None)
    if lost is not None:  # the SQLite file deleted, replaced or damaged (exgrpo_core/run/db_guard.py)
        from exgrpo_core.store.experience_store import resolve_db_url

        head = str(lost) if isinstance(lost, DatabaseLostError) else (
            f"the experience database at {mask_text(resolve_db_url(cfg.run.db_url, run_dir))} is damaged "
            f"({_first_line(getattr(lost, 'orig', lost))})")
        err = DependencyError(f"{head}; run '{cfg.run.name}' {recorded}; put the database back (a backup) and "
                              f"rerun the same command to resume from the last checkpoint, or move {run_dir} "
                              "aside to start the run again")
        err.kind = what
        return err
    if what in ("sampler", "engine"):  # the sampler's or engine's line without "; stopping ..."
        err = DependencyError(f"{_first_line(cause).split('; stopping')[0]}; run '{cfg.run.name}' {recorded}; "
                              "rerun the same command to resume from the last checkpoint")
        err.kind = what
        return err
    if what == "database":
        from exgrpo_core.store.experience_store import resolve_db_url

        head = (f"the experience database at {mask_text(resolve_db_url(cfg.run.db_url, run_dir))} stopped "
                f"answering: {mask_text(_first_line(cause))}")
    elif what == "mlflow":
        from flows.tracking import resolve_tracking_uri

        head = f"the MLflow server at {mask_text(resolve_tracking_uri(cfg))} stopped answering"
    else:
        head = _disk_line(cause, cfg, run_dir)
    then = "once there is space" if what == "disk" else "once it answers again"
    err = DependencyError(f"{head}; run '{cfg.run.name}' {recorded}; {then}, rerun the same command to resume "
                          "from the last checkpoint")
    err.kind = what
    return err


def _disk_line(cause: BaseException, cfg, run_dir: Path) -> str:
    """`the disk under FOLDER is full (N free[, the checkpoint needs about M])`."""
    from exgrpo_core.run import disk_space

    if _sqlite_full(cause):
        from sqlalchemy.engine import make_url

        from exgrpo_core.store.experience_store import resolve_db_url

        url = make_url(resolve_db_url(cfg.run.db_url, run_dir))
        where = Path(url.database).parent if url.get_backend_name() == "sqlite" and url.database else run_dir
    else:
        where = Path(cause.filename).parent if getattr(cause, "filename", None) else run_dir
    detail = getattr(cause, "detail", "")
    if not detail and (free := disk_space.free_bytes(where)) is not None:
        detail = f"{disk_space.human(free)} free"
    return f"the disk under {where} is full" + (f" ({detail})" if detail else "")


_FAILED_RUNS: deque[str] = deque(maxlen=64)  # task and flow runs whose exception was a failed dependency


def _run_id(record: logging.LogRecord) -> str | None:
    return getattr(record, "task_run_id", None) or getattr(record, "flow_run_id", None)


def _is_dependency_fault(record: logging.LogRecord) -> bool:
    """An ERROR record of a failed dependency: the exception it carries is one, or it is the "Finished in
    state Failed" line (no exception, only text) of a task or flow run whose exception record was one;
    Prefect logs that record first."""
    if record.levelno < logging.ERROR:
        return False
    exc = record.exc_info[1] if record.exc_info else None
    if exc is not None:
        if kind(exc) is None:
            return False
        if _run_id(record):
            _FAILED_RUNS.append(str(_run_id(record)))
        return True
    return record.getMessage().startswith("Finished in state Failed") and str(_run_id(record)) in _FAILED_RUNS


def quiet_dependency_faults() -> None:
    """Keep Prefect's failure tracebacks of a failed dependency out of the log (idempotent)."""
    quiet(_LOGGERS, _is_dependency_fault)
