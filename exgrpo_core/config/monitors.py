"""The `monitors` section: replay-health bounds checked each step (exgrpo_core/observe/monitors.py, docs/monitors.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from exgrpo_core.config.base import _Section

MonitorAction = Literal["warn", "checkpoint_and_stop"]


class Bounds(_Section):
    """One replay-health monitor (exgrpo_core/observe/monitors.py, docs/monitors.md): fires at a step whose watched
    value lies outside [min, max]."""

    min: float | None = None
    """Fire when the value falls below this (None: no lower bound)."""
    max: float | None = None
    """Fire when the value rises above this (None: no upper bound)."""
    action: MonitorAction = "warn"
    """warn: report the firing (Prefect event, MLflow tag, CLI line, dashboard banner) and go on;
    checkpoint_and_stop: also write a checkpoint and stop the run with a non-success status."""

    @model_validator(mode="after")
    def _ordered(self) -> "Bounds":
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"monitor bounds need min <= max (got min {self.min} > max {self.max})")
        return self


class MonitorsConfig(_Section):
    """Replay-health monitors: checked after every step; a value outside its bounds is a firing."""

    enabled: bool = True
    """Check the monitors at all."""
    fresh_entropy: Bounds = Bounds(min=0.03, max=3.0)
    """Mean H(o) of the step's fresh rollouts (nats/token): below min a collapse, above max a blow-up."""
    replayed_entropy: Bounds = Bounds(min=0.03, max=3.0)
    """Mean H(o) of the replayed trajectories under the current policy (steps that replay only)."""
    zero_variance: Bounds = Bounds(max=0.95)
    """Fraction of the step's groups whose rewards are all equal (no policy gradient): -> 1 means stalled."""
    iw_max: Bounds = Bounds(max=50.0)
    """Largest importance weight w = pi_theta / pi_behaviour over replayed tokens (steps that replay only)."""
    iw_var: Bounds = Bounds(max=10.0)
    """Variance of w over replayed tokens (steps that replay only)."""
    logprob_gap: Bounds = Bounds(max=0.1)
    """Rollout-vs-trainer log-prob gap (nats/token): the larger of `rollout/logprob_gap` and the vLLM
    weight-push probe `engine/sync_logprob_gap`."""
    timeout_rate: Bounds = Bounds(max=0.05)
    """Fraction of the step's responses whose verification timed out."""
    retired_fraction: Bounds = Bounds(max=0.9)
    """Retired questions / training questions: running away leaves little to learn from."""
    unfilled_slots: Bounds = Bounds(max=0.5)
    """Fraction of the step's replay slots (round(rho*B) once replay is on) left without a trajectory."""
    fresh_staleness: Bounds = Bounds(action="checkpoint_and_stop")
    """(rollout.overlap) Steps from the policy that sampled the step's fresh batch to the one training on it;
    max None: `rollout.max_staleness`. The loop drops older batches, so a firing means a bug."""
    stale_dropped: Bounds = Bounds(max=0.0)
    """(rollout.overlap) Fresh batches the step dropped as older than `rollout.max_staleness` (and sampled again)."""

    @model_validator(mode="before")
    @classmethod
    def _keep_default_bounds(cls, data):
        """A partly given monitor (`--set monitors.iw_max.action=...`) keeps the rest of its defaults."""
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for name, value in data.items():
            field = cls.model_fields.get(name)
            if field is not None and isinstance(field.default, Bounds) and isinstance(value, dict):
                out[name] = {**field.default.model_dump(), **value}
        return out
