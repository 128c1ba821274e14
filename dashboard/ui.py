"""What every page shares: cached queries, run pickers, and errors explained instead of tracebacks.

Query results are cached for `TTL_S` seconds (`st.cache_data`), so a page stays quick on a large
database and still follows a run that is training; with auto-refresh on, a page whose runs are training
redraws its body every `TTL_S` seconds (`st.fragment(run_every=...)`). The chosen run(s) live in
`st.session_state` and in the URL (`?run=ID`, `?runs=ID,ID`), and so do page options (`option`), so a
link reopens the same view.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pandas as pd
import streamlit as st

from dashboard import db, links, mlflow_reader, queries
from exgrpo_core.store.engine import mask_url

TTL_S = 10


def _cached(fn):
    return st.cache_data(ttl=TTL_S, show_spinner="loading...")(fn)


list_runs = _cached(queries.list_runs)
metric_series = _cached(queries.metric_series)
metric_keys = _cached(queries.metric_keys)
buffer_now = _cached(queries.buffer_now)
step_bounds = _cached(queries.step_bounds)
entropy_histogram = _cached(queries.entropy_histogram)
continuous_rewards = _cached(queries.continuous_rewards)
replay_entropy_by_step = _cached(queries.replay_entropy_by_step)
search_questions = _cached(queries.search_questions)
question_groups = _cached(queries.question_groups)
question_trajectories = _cached(queries.question_trajectories)
eval_results = _cached(queries.eval_results)
mlflow_runs_table = _cached(mlflow_reader.runs_table)
mlflow_history = _cached(mlflow_reader.metric_history)
mlflow_run_info = _cached(mlflow_reader.run_info)
replay_buckets = _cached(queries.replay_buckets)
target_weights = _cached(queries.target_weights)
replay_ratio = _cached(queries.replay_ratio)


def no_replay_reason(url: str, runs: pd.DataFrame, where: str = "in this run") -> str | None:
    """Why these runs have replayed nothing, when one reason holds for all: replay off (`buffer.replay_ratio`
    0: it never will) or never switched on; None otherwise (replay on, the pool empty so far)."""
    if all(replay_ratio(url, rid) == 0 for rid in runs["id"]):
        return f"replay is off {where} (`buffer.replay_ratio` is 0)"
    if runs["replay_started_step"].isna().all():
        return f"replay never became active {where}"
    return None


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


def option(name: str, default, choices=None, parse: Callable = str) -> str:
    """Widget key (`<page>.<name>`) of a page option, seeded from the URL (`?name=value`) or `default` when
    the page opens; pass it as the widget's `key` and call `remember(name, value)` after it, so the URL
    follows the page. Keys are per page: Streamlit resets a keyed widget met on another page."""
    key = f"{st.session_state.get('page', 'runs')}.{name}"
    if key not in st.session_state:
        value = default
        raw = st.query_params.get(name)
        if raw is not None:
            try:
                value = parse(raw)
            except (TypeError, ValueError):
                value = default
        st.session_state[key] = value if choices is None or value in choices else default
    return key


def flag(raw: str) -> bool:
    return raw.lower() in ("1", "true", "yes", "on")


def remember(name: str, value) -> None:
    st.query_params[name] = ("1" if value else "0") if isinstance(value, bool) else str(value)


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


def _from_url(runs: pd.DataFrame, name: str = "runs") -> list[str]:
    return [r for r in st.query_params.get(name, "").split(",") if r in set(runs["id"])]


def pick_runs(runs: pd.DataFrame, where=st.sidebar) -> list[str]:
    """Choice of several runs to compare (default: the `runs` query parameter, the last choice, the `run`
    query parameter (a link to one run), else the newest four)."""
    labels = run_label(runs)
    by_label = {v: k for k, v in labels.items()}
    one = [st.query_params["run"]] if st.query_params.get("run") in labels else None
    last = st.session_state["run_ids"] if "run_ids" in st.session_state else (one or list(labels)[:4])
    default = [labels[r] for r in (_from_url(runs) or last) if r in labels]
    chosen = [by_label[v] for v in where.multiselect("Runs", list(by_label), default=default)]
    st.session_state["run_ids"] = chosen
    st.query_params["runs"] = ",".join(chosen)
    return chosen


def pick_overlay(runs: pd.DataFrame) -> pd.DataFrame:
    """Sidebar choice of the runs a page overlays (Buffer, Entropy): by default the one run chosen last
    (`run_id`, `?run=`), or the `overlay` query parameter; add runs to compare them side by side. Returns
    their rows in the chosen order (the first one is also the single-run pages' run)."""
    labels = run_label(runs)
    by_label = {v: k for k, v in labels.items()}
    single = st.session_state.get("run_id") or st.query_params.get("run")
    default = _from_url(runs, "overlay") or [single if single in labels else next(iter(labels))]
    chosen = [by_label[v] for v in st.sidebar.multiselect(
        "Runs", list(by_label), default=[labels[r] for r in default],
        help="Pick two or more runs (e.g. ExGRPO and on-policy) to overlay them.")]
    if chosen:
        st.session_state["run_id"] = chosen[0]
        st.query_params["run"] = chosen[0]
    st.query_params["overlay"] = ",".join(chosen)
    return runs.set_index("id").loc[chosen].reset_index()


def overlay_page(title: str, body: Callable, before: Callable | None = None) -> None:
    """A page over one or more overlaid runs (Buffer, Entropy): title, sidebar, run picker, then
    `before(url, chosen)` (a banner) and `body(url, chosen, names)`, redrawn live while training."""
    st.title(title)
    url = db.database_url()
    sidebar(url)
    runs = runs_or_stop(url)
    chosen = pick_overlay(runs)
    if chosen.empty:
        st.info("Select one or more runs in the sidebar.")
        return
    if before is not None:
        before(url, chosen)
    run_names = names(runs)
    live(chosen, lambda: body(url, chosen, run_names))


def live(chosen: pd.DataFrame, body: Callable[[], None]) -> None:
    """Draw the page body; with the sidebar's auto-refresh on and a chosen run training, redraw it every
    `TTL_S` seconds (a fragment, so the sidebar and the pickers keep their state)."""
    training = bool((chosen["status"] == "running").any()) if len(chosen) else False
    on = st.sidebar.toggle("Auto-refresh while training", key=option("live", True, parse=flag),
                           help=f"redraws this page every {TTL_S} s while a selected run's status is running")
    remember("live", on)
    if on and training:
        st.caption(f"A selected run is training: this page refreshes every {TTL_S} s.")
        st.fragment(lambda: _guarded(body), run_every=TTL_S)()  # a fragment rerun skips the page's own guard
    else:
        body()


def _guarded(body: Callable[[], None]) -> None:
    with explained():
        body()


def run_links(url: str, chosen: pd.DataFrame) -> pd.DataFrame:
    """Per run: its MLflow run (id, page) and Prefect flow run (id, page), as far as they are known."""
    uri = db.mlflow_uri()
    ids = tuple(r for r in chosen["mlflow_run_id"] if isinstance(r, str) and r)
    info = {}
    if uri and ids:
        try:
            info = mlflow_run_info(uri, ids)
        except db.DashboardError:
            info = {}
    rows = []
    for r in chosen.itertuples():
        got = info.get(r.mlflow_run_id, {})
        flow_id, flow_url = links.prefect_flow_run(got.get("tags", {}))
        rows.append({"run": f"{r.name} ({r.id[:8]})", "MLflow run": r.mlflow_run_id,
                     "MLflow page": links.mlflow_run_url(uri, got.get("experiment_id"), r.mlflow_run_id),
                     "Prefect flow run": flow_id, "Prefect page": flow_url})
    return pd.DataFrame(rows)


def show_links(url: str, chosen: pd.DataFrame) -> None:
    """A table linking each run to its MLflow run and Prefect flow run (pages where a web UI exists)."""
    table = run_links(url, chosen)
    ids = {"MLflow run": "not logged", "Prefect flow run": "not recorded"}  # words, not a bare None
    st.dataframe(table.fillna(ids), hide_index=True, width="stretch", column_config={
        "MLflow page": st.column_config.LinkColumn(display_text="open in MLflow"),
        "Prefect page": st.column_config.LinkColumn(display_text="open in Prefect")})
    if table["MLflow page"].isna().all() and table["MLflow run"].notna().any():
        st.caption("MLflow pages are linked when MLFLOW_TRACKING_URI is an MLflow server (http); with a local "
                   "store, open `mlflow ui --backend-store-uri <store>` and look the run id up.")


def names(runs: pd.DataFrame) -> dict[str, str]:
    """run id -> `name (id8)`, unique even when names repeat."""
    return {r.id: f"{r.name} ({r.id[:8]})" for r in runs.itertuples()}
