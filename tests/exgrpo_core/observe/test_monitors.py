"""Replay-health monitors (exgrpo_core/observe/monitors.py): each one tripped by the stats that should trip it."""

import math

import pytest

from exgrpo_core import metrics as M
from exgrpo_core.config.load import ConfigError, load_config
from exgrpo_core.config.schema import MonitorsConfig
from exgrpo_core.observe import monitors

QUESTIONS, SLOTS = 100, 4


def healthy() -> dict[str, float]:
    """A step no default bound objects to: replay on, every slot filled."""
    return {M.RESPONSES: 64.0, M.FRESH_ENTROPY: 0.6, M.REPLAYED_SAMPLES: 4.0, M.REPLAYED_ENTROPY: 0.4,
            M.SOLVE_ALL: 0.25, M.SOLVE_NONE: 0.25, M.REPLAY_TOKENS: 200.0, M.IW_MAX: 3.0, M.IW_VAR: 0.2,
            M.SAMPLER_TRAINER_GAP: 0.0, M.VERIFY_TIMEOUTS: 1.0, M.RETIRED_QUESTIONS: 10.0, M.UNFILLED_SLOTS: 0.0}


def fired(stats, cfg=None, **kw):
    return monitors.check(stats, cfg or MonitorsConfig(), step=7, train_questions=kw.get("questions", QUESTIONS),
                          replay_slots=kw.get("slots", SLOTS))


def test_every_monitor_has_a_config_entry_and_a_label():
    cfg = MonitorsConfig()
    assert all(hasattr(cfg, n) and n in monitors.LABELS for n in M.MONITORS)
    assert set(MonitorsConfig.model_fields) - {"enabled"} == set(M.MONITORS)


def test_a_healthy_step_fires_nothing():
    assert fired(healthy()) == []


TRIPS = [  # (monitor, changes, side)
    ("fresh_entropy", {M.FRESH_ENTROPY: 0.01}, "below"),  # collapse
    ("fresh_entropy", {M.FRESH_ENTROPY: 4.2}, "above"),  # blow-up
    ("replayed_entropy", {M.REPLAYED_ENTROPY: 0.001}, "below"),
    ("replayed_entropy", {M.REPLAYED_ENTROPY: 3.5}, "above"),
    ("zero_variance", {M.SOLVE_ALL: 0.5, M.SOLVE_NONE: 0.5}, "above"),
    ("iw_max", {M.IW_MAX: 120.0}, "above"),
    ("iw_var", {M.IW_VAR: 25.0}, "above"),
    ("logprob_gap", {M.SAMPLER_TRAINER_GAP: 0.3}, "above"),
    ("logprob_gap", {M.ENGINE_SYNC_GAP: 0.2}, "above"),  # the vLLM weight-push probe
    ("timeout_rate", {M.VERIFY_TIMEOUTS: 8.0}, "above"),  # 8 of 64
    ("retired_fraction", {M.RETIRED_QUESTIONS: 95.0}, "above"),
    ("unfilled_slots", {M.UNFILLED_SLOTS: 3.0}, "above"),  # 3 of 4 slots empty
]


@pytest.mark.parametrize("name,changes,side", TRIPS, ids=[f"{t[0]}-{t[2]}-{i}" for i, t in enumerate(TRIPS)])
def test_each_monitor_trips_alone(name, changes, side):
    out = fired({**healthy(), **changes})
    assert [f.name for f in out] == [name]
    f = out[0]
    bounds = getattr(MonitorsConfig(), name)
    assert f.side == side and f.limit == (bounds.min if side == "below" else bounds.max)
    assert f.step == 7 and f.action == "warn" and not f.stops and f.key == f"monitor/{name}"
    assert name in f.message() and ("<" if side == "below" else ">") in f.message()


def test_watched_values_are_the_documented_ratios():
    v = monitors.signals({**healthy(), M.VERIFY_TIMEOUTS: 8.0, M.UNFILLED_SLOTS: 1.0, M.ENGINE_SYNC_GAP: 0.05},
                         train_questions=QUESTIONS, replay_slots=SLOTS)
    assert v["timeout_rate"] == 8 / 64 and v["retired_fraction"] == 0.1 and v["unfilled_slots"] == 0.25
    assert v["zero_variance"] == 0.5 and v["logprob_gap"] == 0.05


def test_a_step_without_replay_does_not_judge_replayed_quantities():
    stats = {**healthy(), M.REPLAYED_SAMPLES: 0.0, M.REPLAYED_ENTROPY: 0.0, M.REPLAY_TOKENS: 0.0, M.IW_MAX: 0.0}
    assert fired(stats) == []  # replayed entropy 0 here means "nothing replayed", not a collapse
    assert fired({**healthy(), M.UNFILLED_SLOTS: 4.0}, slots=0) == []  # on-policy: no replay slots


def test_a_non_finite_value_breaks_any_bound():
    out = fired({**healthy(), M.IW_MAX: math.inf, M.FRESH_ENTROPY: math.nan})
    assert {f.name for f in out} == {"iw_max", "fresh_entropy"}


def test_actions_bounds_and_switches_come_from_the_config():
    cfg = load_config("tiny", ["monitors.iw_max.action=checkpoint_and_stop", "monitors.zero_variance.max=0.4"]).monitors
    assert cfg.iw_max.max == MonitorsConfig().iw_max.max  # a partly given monitor keeps its default bound
    out = fired({**healthy(), M.IW_MAX: 120.0}, cfg)
    assert [(f.name, f.stops) for f in out] == [("zero_variance", False), ("iw_max", True)]
    off = load_config("tiny", ["monitors.enabled=false"]).monitors
    assert fired({**healthy(), M.IW_MAX: 120.0}, off) == []
    none = load_config("tiny", ["monitors.fresh_entropy.min=null"]).monitors
    assert fired({**healthy(), M.FRESH_ENTROPY: 0.0}, none) == []


def test_bad_monitor_settings_are_named():
    with pytest.raises(ConfigError, match="monitors.iw_max.action"):
        load_config("tiny", ["monitors.iw_max.action=pause"])
    with pytest.raises(ConfigError, match="min <= max"):
        load_config("tiny", ["monitors.fresh_entropy.min=5"])
    with pytest.raises(ConfigError, match="monitors.no_such"):
        load_config("tiny", ["monitors.no_such.max=1"])


def test_fresh_staleness_over_the_rollout_bound_stops_and_a_dropped_batch_warns():
    def at(staleness: float, dropped: float, **kw):
        stats = {**healthy(), M.FRESH_STALENESS: staleness, M.FRESH_DROPPED: dropped}
        return monitors.check(stats, kw.pop("cfg", MonitorsConfig()), step=7, train_questions=QUESTIONS,
                              replay_slots=SLOTS, **kw)

    assert at(1.0, 0.0, max_staleness=1) == [] and at(0.0, 0.0, max_staleness=0) == []
    (f,) = at(2.0, 0.0, max_staleness=1)  # the loop drops such a batch: a firing is a bug
    assert (f.name, f.value, f.limit, f.side, f.stops) == ("fresh_staleness", 2.0, 1.0, "above", True)
    assert f.message() == "monitor fresh_staleness at step 7: fresh batch staleness (steps) 2 > 1 (checkpoint_and_stop)"
    (f,) = at(0.0, 1.0, max_staleness=0)  # dropped and sampled again: trained on-policy, said once
    assert (f.name, f.value, f.limit, f.stops) == ("stale_dropped", 1.0, 0.0, False)
    assert at(2.0, 0.0) == []  # no bound given and none in the config: not judged
    cfg = load_config("tiny", ["monitors.fresh_staleness.max=3", "monitors.fresh_staleness.action=warn"]).monitors
    assert at(2.0, 0.0, cfg=cfg, max_staleness=1) == []  # the config's own max wins
    assert fired(healthy()) == []  # overlap off: neither is logged, neither judged
