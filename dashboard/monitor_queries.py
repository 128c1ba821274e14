"""Queries of the monitor banner and the Staleness page (read-only, SQLAlchemy Core, as `queries`).

Monitor firings are the step metrics `monitor/<name>` (exgrpo_core/observe/monitors.py); replay ages come
from the replays joined to the trajectories they replayed (age = replay step - sampling step). Steps are
step numbers, as in `queries` and the monitors' own messages.
"""

from __future__ import annotations

import pandas as pd
from sqlalchemy import and_, func, select

from dashboard.queries import BY_FIRST_TWO, _frame, index_of, numbered, reading
from exgrpo_core import metrics as M
from exgrpo_core.observe.monitors import LABELS
from exgrpo_core.store.tables import Replay, Run, StepMetric, Trajectory

MONITOR_KEYS = tuple(M.monitor_key(name) for name in LABELS)


def monitor_firings(url: str, run_ids: tuple[str, ...]) -> pd.DataFrame:
    """Per run and monitor: [run_id, key, firings, first_step, last_step, last_value] (value at last_step)."""
    SM = StepMetric
    agg = (select(SM.run_id, SM.key, func.count().label("n"), func.min(SM.step).label("first"),
                  func.max(SM.step).label("last"))
           .where(SM.run_id.in_(run_ids), SM.key.in_(MONITOR_KEYS)).group_by(SM.run_id, SM.key).subquery())
    stmt = (select(agg.c.run_id, agg.c.key, agg.c.n, agg.c.first, agg.c.last, SM.value)
            .join(SM, and_(SM.run_id == agg.c.run_id, SM.key == agg.c.key, SM.step == agg.c.last))
            .order_by(agg.c.run_id, agg.c.key))
    with reading(url, "monitor firings") as conn:
        out = _frame(conn, stmt, ["run_id", "key", "firings", "first_step", "last_step", "last_value"])
    return numbered(out, "first_step", "last_step")


def run_settings(url: str, run_ids: tuple[str, ...]) -> pd.DataFrame:
    """[id, name, status, config_json] of the runs (the monitors' bounds and actions are in the config), the
    run updated last first."""
    stmt = (select(Run.id, Run.name, Run.status, Run.config_json).where(Run.id.in_(run_ids))
            .order_by(Run.updated_at.desc(), Run.created_at.desc()))
    with reading(url, "runs") as conn:
        return _frame(conn, stmt, ["id", "name", "status", "config_json"])


def replay_ages(url: str, run_id: str, first_step: int = 1) -> pd.DataFrame:
    """[step, age, replayed]: how many trajectories each step from step number `first_step` on replayed at each age
    (one trajectory lookup per replay: the page reads a window of recent steps by default)."""
    age = (Replay.step - Trajectory.step).label("age")
    stmt = (select(Replay.step, age, func.count()).join(Trajectory, Trajectory.id == Replay.trajectory_id)
            .where(Replay.run_id == run_id, Replay.step >= index_of(first_step))
            .group_by(*BY_FIRST_TWO).order_by(*BY_FIRST_TWO))
    with reading(url, "replay ages") as conn:
        return numbered(_frame(conn, stmt, ["step", "age", "replayed"]), "step")
