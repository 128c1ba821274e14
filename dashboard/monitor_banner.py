"""The monitor banner of the Runs and Buffer pages: which replay-health monitors fired in the shown runs.

`banner_lines` is plain (tested without Streamlit); `render` draws, in one collapsible box, one warning
(or, for a run a monitor stopped, an error) per run, the run updated last first. docs/monitors.md.
"""

from __future__ import annotations

import json
import math

import pandas as pd
import streamlit as st

from dashboard import monitor_queries as Q
from dashboard.ui import TTL_S

MAX_RUNS = 8
_firings = st.cache_data(ttl=TTL_S, show_spinner=False)(Q.monitor_firings)
_settings = st.cache_data(ttl=TTL_S, show_spinner=False)(Q.run_settings)


def _bound_text(value: float | None, bounds: dict) -> str:
    if value is None or not math.isfinite(value):
        return "not finite"
    lo, hi = bounds.get("min"), bounds.get("max")
    if lo is not None and value < lo:
        return f"{value:.4g} < {lo:g}"
    if hi is not None and value > hi:
        return f"{value:.4g} > {hi:g}"
    return f"{value:.4g}"


def banner_lines(firings: pd.DataFrame, settings: pd.DataFrame) -> list[tuple[str, str]]:
    """(level, text) per run with firings: level `error` for a run a monitor stopped, else `warning`."""
    out = []
    for run in settings.itertuples():
        mine = firings[firings.run_id == run.id]
        if mine.empty:
            continue
        monitors = json.loads(run.config_json or "{}").get("monitors", {})
        parts = []
        for f in mine.itertuples():
            name = f.key.split("/", 1)[1]  # monitor/<name>
            bounds = monitors.get(name, {})
            value = None if pd.isna(f.last_value) else float(f.last_value)
            steps = f"step {f.first_step}" if f.firings == 1 else f"{f.firings} steps ({f.first_step}-{f.last_step})"
            parts.append(f"`{name}` at {steps}, last {_bound_text(value, bounds)} ({bounds.get('action', 'warn')})")
        stopped = run.status == "stopped"
        head = f"**{run.name}** ({run.id[:8]}) " + ("was stopped by a monitor: " if stopped else "monitors fired: ")
        out.append(("error" if stopped else "warning", head + "; ".join(parts)))
    return out


def render(url: str, run_ids: tuple[str, ...]) -> None:
    """One banner per run of `run_ids` (the shown runs; at most MAX_RUNS) whose monitors fired, in an
    expander open while a run in it was stopped by a monitor; nothing when none fired."""
    if not run_ids:
        return
    lines = banner_lines(_firings(url, run_ids), _settings(url, run_ids))
    if not lines:
        return
    stopped = sum(level == "error" for level, _ in lines)
    title = f"Monitors fired in {len(lines)} of the {len(run_ids)} shown runs"
    title += f" ({stopped} stopped)" if stopped else ""
    with st.expander(title, expanded=bool(stopped), icon=":material/monitor_heart:"):
        for level, text in lines[:MAX_RUNS]:
            (st.error if level == "error" else st.warning)(text, icon=":material/monitor_heart:")
        if len(lines) > MAX_RUNS:
            st.warning(f"... and {len(lines) - MAX_RUNS} more runs with monitor firings.")
