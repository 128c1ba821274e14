"""Read-only view of the MLflow runs behind the database's runs (the Results page's comparison).

Only `get_run` and `get_metric_history` are called, never a write. A local SQLite store that does not
exist is reported instead of opened (opening would create it), and an http(s) server is probed with a
short timeout so a dead server is a message on the page, not a hang.
"""

from __future__ import annotations

import functools
import urllib.error
import urllib.request
from pathlib import Path

import pandas as pd

from dashboard.db import DashboardError

PROBE_TIMEOUT_S = 3.0


def _check(uri: str) -> None:
    if uri.startswith("sqlite:///"):
        path = Path(uri[len("sqlite:///"):])
        if not path.is_file():
            raise DashboardError(f"no MLflow store at {path} yet (MLFLOW_TRACKING_URI / --mlflow-uri)")
    elif uri.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=PROBE_TIMEOUT_S):
                pass
        except (urllib.error.URLError, OSError) as e:
            raise DashboardError(f"MLflow server at {uri} is unreachable ({getattr(e, 'reason', e)})") from None


@functools.lru_cache(maxsize=4)
def _client(uri: str):
    from mlflow.tracking import MlflowClient

    _check(uri)
    return MlflowClient(tracking_uri=uri)


def runs_table(uri: str, mlflow_run_ids: tuple[str, ...]) -> pd.DataFrame:
    """One row per MLflow run: name, status, start time, every param (`param:<name>`) and latest metric."""
    client, rows = _client(uri), []
    for rid in mlflow_run_ids:
        try:
            run = client.get_run(rid)
        except Exception as e:  # noqa: BLE001 - MLflow raises its own types; the page names the run
            raise DashboardError(f"MLflow run {rid} cannot be read from {uri}: {str(e).splitlines()[0]}") from None
        row = {"mlflow_run_id": rid, "mlflow_name": run.info.run_name, "mlflow_status": run.info.status,
               "started": pd.to_datetime(run.info.start_time, unit="ms", utc=True)}
        row.update({f"param:{k}": v for k, v in run.data.params.items()})
        row.update(run.data.metrics)
        rows.append(row)
    return pd.DataFrame(rows)


STEP_TAG, STEP_NUMBERS = "exgrpo.step_numbering", "updates_done"  # set by flows/tracking.py on new runs


def metric_history(uri: str, mlflow_run_ids: tuple[str, ...], keys: tuple[str, ...]) -> pd.DataFrame:
    """[mlflow_run_id, key, step, value] for each run and key (absent keys give no rows); steps are step
    numbers (metrics.step_number), also for a run logged before them (no step tag: 0-based, shown +1)."""
    client, rows = _client(uri), []
    for rid in mlflow_run_ids:
        try:
            shift = 0 if client.get_run(rid).data.tags.get(STEP_TAG) == STEP_NUMBERS else 1
        except Exception:  # noqa: BLE001 - the history read below names the run
            shift = 0
        for key in keys:
            try:
                hist = client.get_metric_history(rid, key)
            except Exception as e:  # noqa: BLE001
                raise DashboardError(f"MLflow metric {key} of run {rid} cannot be read: {str(e).splitlines()[0]}") \
                    from None
            rows += [(rid, key, m.step + shift, m.value) for m in hist]
    return pd.DataFrame(rows, columns=["mlflow_run_id", "key", "step", "value"])


def run_info(uri: str, mlflow_run_ids: tuple[str, ...]) -> dict[str, dict]:
    """{mlflow run id: {"experiment_id", "tags"}} of the runs that can be read (others are left out)."""
    client, out = _client(uri), {}
    for rid in mlflow_run_ids:
        try:
            run = client.get_run(rid)
        except Exception:  # noqa: BLE001 - a deleted run has no link, the page still draws
            continue
        out[rid] = {"experiment_id": run.info.experiment_id, "tags": dict(run.data.tags)}
    return out
