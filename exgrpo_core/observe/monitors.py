"""Replay-health monitors: each step's metrics checked against the bounds in the `monitors` config.

Pure: `signals` derives the watched values from one step's metrics dict (the metric contract),
`check` compares them with the bounds and returns the firings. The training flow reports each firing
(Prefect event, MLflow tag and metric, CLI line, stored step metric `monitor/<name>`) and carries out
its action (flows/monitor_events.py); the dashboard shows them as a banner. docs/monitors.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from exgrpo_core import metrics as M
from exgrpo_core.config.schema import Bounds, MonitorsConfig

LABELS = {
    "fresh_entropy": "fresh entropy H(o)", "replayed_entropy": "replayed entropy H(o)",
    "zero_variance": "zero-variance group fraction", "iw_max": "max importance weight w",
    "iw_var": "importance weight variance", "logprob_gap": "rollout-vs-trainer log-prob gap",
    "timeout_rate": "verifier timeout rate", "retired_fraction": "retired question fraction",
    "unfilled_slots": "unfilled replay slot fraction", "fresh_staleness": "fresh batch staleness (steps)",
    "stale_dropped": "fresh batches dropped as too stale",
}
"""What each monitor watches, as the CLI line and the banner say it."""


@dataclass(frozen=True)
class Firing:
    """One monitor outside its bounds at one step: `value` broke `limit` (`side` below / above); `step` is
    the step number users read (metrics.step_number: updates done, as MLflow and the checkpoints count)."""

    name: str
    step: int
    value: float
    limit: float
    side: str
    action: str

    @property
    def key(self) -> str:
        return M.monitor_key(self.name)

    @property
    def stops(self) -> bool:
        return self.action == "checkpoint_and_stop"

    def message(self) -> str:
        """`monitor iw_max at step 7: max importance weight w 63.2 > 50 (warn)`."""
        sign = "<" if self.side == "below" else ">"
        return (f"monitor {self.name} at step {self.step}: {LABELS[self.name]} {self.value:.4g} {sign} "
                f"{self.limit:g} ({self.action})")


def signals(stats: dict[str, float], *, train_questions: int, replay_slots: int) -> dict[str, float | None]:
    """The watched values of one step; None where the step did not measure it (nothing replayed, no
    replay slots, no responses). `train_questions`: questions in the training set; `replay_slots`:
    round(rho * B), the experiential questions a step asks for once replay is on."""
    def get(key: str) -> float | None:
        v = stats.get(key)
        return None if v is None else float(v)

    replayed = (get(M.REPLAYED_SAMPLES) or 0) > 0
    replay_tokens = (get(M.REPLAY_TOKENS) or 0) > 0
    responses = get(M.RESPONSES) or 0
    gaps = [g for g in (get(M.SAMPLER_TRAINER_GAP), get(M.ENGINE_SYNC_GAP)) if g is not None]
    zero = [get(M.SOLVE_ALL), get(M.SOLVE_NONE)]
    unfilled = get(M.UNFILLED_SLOTS)
    retired = get(M.RETIRED_QUESTIONS)
    return {
        "fresh_entropy": get(M.FRESH_ENTROPY) if responses else None,
        "replayed_entropy": get(M.REPLAYED_ENTROPY) if replayed else None,
        "zero_variance": None if None in zero else zero[0] + zero[1],
        "iw_max": get(M.IW_MAX) if replay_tokens else None,
        "iw_var": get(M.IW_VAR) if replay_tokens else None,
        "logprob_gap": max(gaps) if gaps else None,
        "timeout_rate": (get(M.VERIFY_TIMEOUTS) or 0) / responses if responses else None,
        "retired_fraction": retired / train_questions if retired is not None and train_questions else None,
        "unfilled_slots": unfilled / replay_slots if unfilled is not None and replay_slots else None,
        "fresh_staleness": get(M.FRESH_STALENESS),  # logged only with rollout.overlap
        "stale_dropped": get(M.FRESH_DROPPED),
    }


def breach(value: float, bounds: Bounds) -> tuple[float, str] | None:
    """(limit, side) when `value` lies outside the bounds; a NaN or infinite value breaks any bound set."""
    if bounds.min is not None and (value < bounds.min or math.isnan(value)):
        return bounds.min, "below"
    if bounds.max is not None and (value > bounds.max or math.isnan(value)):
        return bounds.max, "above"
    return None


def check(stats: dict[str, float], cfg: MonitorsConfig, *, step: int, train_questions: int,
          replay_slots: int, max_staleness: int | None = None) -> list[Firing]:
    """Every monitor of `cfg` whose watched value this step lies outside its bounds, in `M.MONITORS` order.
    `max_staleness`: the rollout's bound (rollout/overlap.py `bound`), the `fresh_staleness` monitor's max
    unless the config sets one."""
    if not cfg.enabled:
        return []
    values = signals(stats, train_questions=train_questions, replay_slots=replay_slots)
    out = []
    for name in M.MONITORS:
        bounds: Bounds = getattr(cfg, name)
        if name == "fresh_staleness" and bounds.max is None and max_staleness is not None:
            bounds = bounds.model_copy(update={"max": float(max_staleness)})
        value = values[name]
        hit = None if value is None else breach(value, bounds)
        if hit is not None:
            out.append(Firing(name, step, value, hit[0], hit[1], bounds.action))
    return out
