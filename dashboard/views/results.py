"""Results: benchmark evaluations per run and step from the database, training curves of any logged
metric, the runs' MLflow records side by side (params that differ, final metrics, any metric's curve),
and links to each run's MLflow run and Prefect flow run. The metrics picked are kept in the URL."""

import pandas as pd
import streamlit as st

from dashboard import charts, db, ui
from exgrpo_core import metrics as M

CURVES = {M.REWARD_MEAN: "reward mean", M.FRESH_PASS1: "fresh pass@1"}
EVAL_AVERAGE = M.eval_key("average", "pass@1")
MLFLOW_FINAL = (M.REWARD_MEAN, M.FRESH_PASS1, EVAL_AVERAGE, M.BUFFER_QUESTIONS, M.RETIRED_QUESTIONS)
NOT_METRICS = {"mlflow_run_id", "mlflow_name", "mlflow_status", "started", "run"}


def _evaluations(url: str, chosen: list[str], names: dict[str, str]) -> None:
    st.subheader("Benchmarks")
    ev = ui.eval_results(url, tuple(chosen))
    if ev.empty:
        st.info("No evaluation results for these runs yet. Runs evaluate every `eval.every` steps and at the "
                "end with `eval.final` (or later with `exgrpo evaluate`); results appear here per benchmark.")
        return
    ev["run"] = ev["run_id"].map(names)
    choices = sorted(ev["metric"].unique())
    metric = st.selectbox("benchmark metric", choices, key=ui.option(
        "eval_metric", "pass@1" if "pass@1" in choices else choices[0], choices=choices))
    ui.remember("eval_metric", metric)
    sel = ev[ev.metric == metric]
    table = sel.pivot_table(index=["run", "step"], columns="benchmark", values="value").reset_index()
    st.dataframe(table, hide_index=True, width="stretch")
    for bench in sorted(sel.benchmark.unique()):
        st.altair_chart(charts.lines(sel[sel.benchmark == bench], "value", "run", f"{bench}: {metric}", metric),
                        width="stretch")


def _mlflow(runs: pd.DataFrame, chosen: list[str], names: dict[str, str]) -> None:
    st.subheader("MLflow runs side by side")
    uri = db.mlflow_uri()
    linked = runs[runs.id.isin(chosen) & runs.mlflow_run_id.notna()]
    if not uri or linked.empty:
        st.info("No MLflow store configured (`--mlflow-uri` / MLFLOW_TRACKING_URI)" if not uri else
                "The selected runs have no MLflow run recorded yet.")
        return
    try:
        ids = tuple(linked.mlflow_run_id)
        table = ui.mlflow_runs_table(uri, ids)
    except db.DashboardError as e:
        st.warning(f"MLflow cannot be read, so only database results are shown: {e}")
        return
    table["run"] = table.mlflow_run_id.map(dict(zip(linked.mlflow_run_id, linked.id.map(names))))
    params = [c for c in table.columns if c.startswith("param:") and table[c].nunique(dropna=False) > 1
              and not c.startswith(("param:run.name", "param:run.output_dir"))]
    finals = [k for k in MLFLOW_FINAL if k in table.columns]
    st.caption("Final logged value of each metric; parameters shown are those that differ between the runs.")
    st.dataframe(table[["run", "mlflow_name", "mlflow_status", *finals, *params]].rename(
        columns=lambda c: c.removeprefix("param:")), hide_index=True, width="stretch")
    logged = sorted(c for c in table.columns if c not in NOT_METRICS and not c.startswith("param:"))
    if not logged:
        return
    key = st.selectbox("MLflow metric", logged, key=ui.option(
        "mlflow_metric", EVAL_AVERAGE if EVAL_AVERAGE in logged else logged[0], choices=logged))
    ui.remember("mlflow_metric", key)
    hist = ui.mlflow_history(uri, ids, (key,))
    if not hist.empty:
        hist["run"] = hist.mlflow_run_id.map(dict(zip(linked.mlflow_run_id, linked.id.map(names))))
        st.altair_chart(charts.lines(hist, "value", "run", f"{key} (MLflow)", key), width="stretch")


def _curves(url: str, chosen: list[str], names: dict[str, str]) -> None:
    st.subheader("Training curves")
    keys = ui.metric_keys(url, tuple(chosen))
    if not keys:
        st.info("The selected runs have not completed a step yet.")
        return
    default = [k for k in CURVES if k in keys] or keys[:1]
    picked = st.multiselect("training metrics", keys, format_func=lambda k: CURVES.get(k, k), key=ui.option(
        "curves", default, parse=lambda s: [k for k in s.split(",") if k in keys] or default))
    ui.remember("curves", ",".join(picked))
    series = ui.metric_series(url, tuple(chosen), tuple(picked))
    series["run"] = series["run_id"].map(names)
    cols = st.columns(2)
    for i, key in enumerate(picked):
        cols[i % 2].altair_chart(charts.lines(series[series.key == key], "value", "run", CURVES.get(key, key),
                                              CURVES.get(key, key)), width="stretch")


def body(url: str, runs: pd.DataFrame, chosen: list[str], names: dict[str, str]) -> None:
    _evaluations(url, chosen, names)
    _curves(url, chosen, names)
    _mlflow(runs, chosen, names)
    st.subheader("Links")
    ui.show_links(url, runs.set_index("id").loc[chosen].reset_index())


def render() -> None:
    st.title("Results")
    url = db.database_url()
    ui.sidebar(url)
    runs = ui.runs_or_stop(url)
    chosen = ui.pick_runs(runs)
    if not chosen:
        st.info("Select one or more runs in the sidebar.")
        return
    names = ui.names(runs)
    ui.live(runs[runs.id.isin(chosen)], lambda: body(url, runs, chosen, names))


with ui.explained():
    render()
