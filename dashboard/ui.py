"""What every page shares: cached queries, run pickers, and errors explained instead of tracebacks.

Query results are cached for `TTL_S` seconds (`st.cache_data`), so a page stays quick on a large
database and still follows a run that is training. The chosen run(s) live in `st.session_state`
(and the `run` query parameter), so moving between pages keeps the selection.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pandas as pd
import streamlit as st

from dashboard import db, mlflow_reader, queries
from exgrpo_core.store.engine import mask_url

TTL_S = 10


def _cached(fn):
    return st.cache_data(ttl=TTL_S, show_spinner="loading...")(fn)


list_runs = _cached(queries.list_runs)
metric_series = _cached(queries.metric_series)
buffer_now = _cached(queries.buffer_now)
step_bounds = _cached(queries.step_bounds)
entropy_histogram = _cached(queries.entropy_histogram)
replay_entropy_by_step = _cached(queries.replay_entropy_by_step)
search_questions = _cached(queries.search_questions)
question_groups = _cached(queries.question_groups)
question_trajectories = _cached(queries.question_trajectories)
eval_results = _cached(queries.eval_results)
mlflow_runs_table = _cached(mlflow_reader.runs_table)
mlflow_history = _cached(mlflow_reader.metric_history)


@contextmanager
def explained() -> Iterator[None]:
    """Run a page body; a known problem becomes a message on the page, anything else a short error."""
    try:
        yield
    except db.DashboardError as e:
        st.error(str(e))
        st.stop()
    except Exception as e:  # noqa: BLE001 - the page must never show a traceback
        st.error(f"The page could not be drawn: {type(e).__name__}: {e}")
        st.stop()


def sidebar(url: str) -> None:
    st.sidebar.caption(f"experience database: `{mask_url(url)}`")
    uri = db.mlflow_uri()
    st.sidebar.caption(f"MLflow: `{mask_url(uri)}`" if uri else "MLflow: not configured")
    if st.sidebar.button("Refresh now", help=f"results are cached for {TTL_S} s"):
        st.cache_data.clear()


def runs_or_stop(url: str) -> pd.DataFrame:
    """All runs; when there are none, explain how to start one and stop the page."""
    runs = list_runs(url)
    if runs.empty:
        st.info(f"No runs yet in `{mask_url(url)}`. Start one with `exgrpo train --config tiny` "
                "(or point the dashboard at another database with `exgrpo dashboard --db-url URL`); "
                "this page fills in as the run writes its first steps.")
        st.stop()
    return runs


def run_label(runs: pd.DataFrame) -> dict[str, str]:
    return {r.id: f"{r.name} · {r.id[:8]} · {r.status} · {r.step} steps" for r in runs.itertuples()}


def pick_run(runs: pd.DataFrame) -> pd.Series:
    """Sidebar choice of one run (default: the last one chosen, the `run` query parameter, or the newest)."""
    labels = run_label(runs)
    ids = list(labels)
    wanted = st.session_state.get("run_id") or st.query_params.get("run")
    if wanted not in labels:
        wanted = ids[0]
    label = st.sidebar.selectbox("Run", list(labels.values()), index=ids.index(wanted))
    chosen = ids[list(labels.values()).index(label)]
    st.session_state["run_id"] = chosen
    st.query_params["run"] = chosen
    return runs[runs["id"] == chosen].iloc[0]


def pick_runs(runs: pd.DataFrame, where=st.sidebar) -> list[str]:
    """Choice of several runs to compare (default: the last choice, else the newest four)."""
    labels = run_label(runs)
    by_label = {v: k for k, v in labels.items()}
    default = [labels[r] for r in st.session_state.get("run_ids", list(labels)[:4]) if r in labels]
    chosen = [by_label[v] for v in where.multiselect("Runs", list(by_label), default=default)]
    st.session_state["run_ids"] = chosen
    return chosen


def names(runs: pd.DataFrame) -> dict[str, str]:
    """run id -> `name (id8)`, unique even when names repeat."""
    return {r.id: f"{r.name} ({r.id[:8]})" for r in runs.itertuples()}
