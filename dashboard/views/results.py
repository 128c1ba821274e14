"""Results: benchmark evaluations per run and step from the database, training curves, and the
runs' MLflow records side by side (params that differ, final metrics, evaluation curves)."""

import pandas as pd
import streamlit as st

from dashboard import charts, db, ui
from exgrpo_core import metrics as M

CURVES = {M.REWARD_MEAN: "reward mean", M.FRESH_PASS1: "fresh pass@1"}
EVAL_AVERAGE = M.eval_key("average", "pass@1")
MLFLOW_FINAL = (M.REWARD_MEAN, M.FRESH_PASS1, EVAL_AVERAGE, M.BUFFER_QUESTIONS, M.RETIRED_QUESTIONS)


def _evaluations(url: str, chosen: list[str], names: dict[str, str]) -> None:
    st.subheader("Benchmarks")
    ev = ui.eval_results(url, tuple(chosen))
    if ev.empty:
        st.info("No evaluation results for these runs yet. Runs evaluate every `eval.every` steps and at the "
                "end with `eval.final` (or later with `exgrpo evaluate`); results appear here per benchmark.")
        return
    ev["run"] = ev["run_id"].map(names)
    metric = st.selectbox("metric", sorted(ev["metric"].unique()),
                          index=sorted(ev["metric"].unique()).index("pass@1") if "pass@1" in set(ev.metric) else 0)
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
        hist = ui.mlflow_history(uri, ids, (EVAL_AVERAGE,))
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
    if not hist.empty:
        hist["run"] = hist.mlflow_run_id.map(dict(zip(linked.mlflow_run_id, linked.id.map(names))))
        st.altair_chart(charts.lines(hist, "value", "run", "average pass@1 over benchmarks (MLflow)", "pass@1"),
                        width="stretch")


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
    _evaluations(url, chosen, names)
    st.subheader("Training curves")
    series = ui.metric_series(url, tuple(chosen), tuple(CURVES))
    if series.empty:
        st.info("The selected runs have not completed a step yet.")
    else:
        series["run"] = series["run_id"].map(names)
        cols = st.columns(len(CURVES))
        for col, (key, label) in zip(cols, CURVES.items()):
            col.altair_chart(charts.lines(series[series.key == key], "value", "run", label, label), width="stretch")
    _mlflow(runs, chosen, names)


with ui.explained():
    render()
