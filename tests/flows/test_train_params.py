"""Which run a training flow run trains (flows/train_params.py) and the pictures it logs (flows/plots.py)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from exgrpo_core.config.load import PRESETS_DIR, ConfigError
from flows.plots import write_run_pictures
from flows.train_params import PRESETS, form_overrides, run_config

FLOW_RUN = uuid.UUID("3f2a9c00-0000-4000-8000-000000000000")


def test_the_presets_offered_are_the_shipped_yaml_files():
    assert set(PRESETS) == {p.stem for p in PRESETS_DIR.glob("*.yaml")}
    assert {"tiny", "cpu-demo", "paper"} <= set(PRESETS)


def test_typed_fields_follow_the_overrides_and_win():
    sets = form_overrides(["run.steps=9", "rollout.group_size=4"], run_name=None, steps=3, replay_ratio=0.0, seed=None)
    assert sets == ["run.steps=9", "rollout.group_size=4", "run.steps=3", "buffer.replay_ratio=0.0"]
    cfg, _ = run_config({"preset": "tiny", "overrides": ["run.steps=9"], "steps": 3, "replay_ratio": 0.0,
                         "seed": 7}, "brave-otter", FLOW_RUN)
    assert (cfg.run.steps, cfg.buffer.replay_ratio, cfg.run.seed) == (3, 0.0, 7)


def test_a_form_run_without_a_name_is_a_new_run_named_after_its_flow_run():
    cfg, sets = run_config({"preset": "cpu-demo"}, "brave-otter", FLOW_RUN)
    assert cfg.run.name == "cpu-demo-brave-otter-3f2a" and cfg.run.resume == "never"
    assert sets[-2:] == ["run.name=cpu-demo-brave-otter-3f2a", "run.resume=never"]
    other, _ = run_config({"preset": "cpu-demo"}, "brave-otter", uuid.UUID(int=0xbeef << 112))
    assert other.run.name == "cpu-demo-brave-otter-beef"  # the same flow run name twice: still two runs


def test_a_retry_of_a_form_run_continues_the_run_its_first_attempt_started():
    cfg, sets = run_config({"preset": "cpu-demo"}, "brave-otter", FLOW_RUN, retry=True)
    assert cfg.run.name == "cpu-demo-brave-otter-3f2a" and cfg.run.resume == "auto"
    assert sets[-2:] == ["run.name=cpu-demo-brave-otter-3f2a", "run.resume=auto"]


@pytest.mark.parametrize("params", [{"run_name": "mine"}, {"overrides": ["run.name=mine"]}])
def test_a_named_run_is_resumed_by_that_name(params):
    cfg, _ = run_config({"preset": "tiny", **params}, "brave-otter", FLOW_RUN)
    assert cfg.run.name == "mine" and cfg.run.resume == "auto"


def test_a_given_config_is_used_as_is():
    base, _ = run_config({"preset": "tiny", "run_name": "x"})
    cfg, sets = run_config({"preset": "paper", "config": base.model_dump(mode="json"), "run_name": "y"}, "a", FLOW_RUN)
    assert cfg == base and sets is None


def test_an_unknown_preset_is_a_config_error():
    with pytest.raises(ConfigError, match="not found"):
        run_config({"preset": "nope"}, "a", FLOW_RUN)


def test_pictures_and_their_numbers(tmp_path, monkeypatch):
    from flows import plots

    labels, save = {}, plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, path: labels.setdefault(
        Path(path).name, (fig.axes[0].get_title(), fig.axes[0].get_ylabel())) and save(fig, path))
    folder = write_run_pictures(tmp_path / "p", step=4, since_step=3, group_size=4, correct=[0.1, 0.2],
                                incorrect=[1.5], buckets={0: 5, 2: 1, 4: 0}, replays={1: 3, 2: 1},
                                weights={1: 0.6, 2: 1.0, 3: 0.6})
    for name in ("entropy.png", "buckets.png", "replays.png"):
        assert (folder / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads((folder / "data.json").read_text())
    assert data["entropy_correct"] == [0.1, 0.2] and data["replays"] == {"1": 3, "2": 1}
    # bucket counts cover every rolled-out question (k = 0 and retired k = K too), not only the pool
    assert labels["buckets.png"] == ("Questions by bucket after step 5", "questions rolled out so far")
    empty = write_run_pictures(tmp_path / "e", step=0, since_step=0, group_size=2, correct=[], incorrect=[],
                               buckets={}, replays={}, weights={1: 1.0})  # nothing yet: still drawn
    assert (empty / "entropy.png").stat().st_size > 0
