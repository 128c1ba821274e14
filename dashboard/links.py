"""Links from a run to its MLflow run and its Prefect flow run.

MLflow: a run's page is `<server>/#/experiments/<experiment id>/runs/<run id>?workflowType=machine_learning`
when MLFLOW_TRACKING_URI is an http(s) server (a local SQLite / file store has no web page: the id is shown
instead); the parameter opens MLflow 3's model-training view, not the GenAI one a fresh browser gets.
Prefect: the flow run is found in the MLflow run's tags (`PREFECT_TAGS`, set by the training flow); its
page is the tag's URL, else `<Prefect UI>/runs/flow-run/<id>` with the UI derived from PREFECT_UI_URL or
PREFECT_API_URL. A run without these tags gets no Prefect link.
"""

from __future__ import annotations

import os

# MLflow tags the training flow sets on its run: the Prefect flow run that trained it (id, URL)
PREFECT_ID_TAGS = ("prefect.flow_run_id",)
PREFECT_URL_TAGS = ("prefect.flow_run_url",)
TRAINING_VIEW = "workflowType=machine_learning"  # as flows/tracking.py's links


def mlflow_run_url(tracking_uri: str | None, experiment_id: str | None, run_id: str | None) -> str | None:
    """The MLflow UI page of a run, or None when the store has no web UI or the run is unknown."""
    if not (tracking_uri and run_id and experiment_id) or not tracking_uri.startswith(("http://", "https://")):
        return None
    return f"{tracking_uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}?{TRAINING_VIEW}"


def prefect_ui_url() -> str | None:
    """PREFECT_UI_URL, else PREFECT_API_URL without its trailing /api, else None."""
    ui = os.environ.get("PREFECT_UI_URL")
    if ui:
        return ui.rstrip("/")
    api = os.environ.get("PREFECT_API_URL", "").rstrip("/")
    return api.removesuffix("/api") if api.startswith(("http://", "https://")) else None


def prefect_flow_run(tags: dict[str, str]) -> tuple[str | None, str | None]:
    """(flow run id, its UI page) from an MLflow run's tags; (None, None) when the run has none."""
    fid = next((tags[t] for t in PREFECT_ID_TAGS if tags.get(t)), None)
    url = next((tags[t] for t in PREFECT_URL_TAGS if tags.get(t)), None)
    if url is None and fid and (ui := prefect_ui_url()):
        url = f"{ui}/runs/flow-run/{fid}"
    return fid, url
