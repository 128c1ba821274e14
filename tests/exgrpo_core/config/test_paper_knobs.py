"""The paper's second-version knobs: defaults keep today's behaviour, bad values are one-line errors.

Run: .venv/bin/python -m pytest tests/exgrpo_core/config/test_paper_knobs.py -q
"""

import pytest

from exgrpo_core.config.load import ConfigError, load_config


def test_defaults_are_todays_behaviour():
    cfg = load_config("tiny")
    assert cfg.selection.mu == 0.5
    assert cfg.loss.replay_old_logprobs == "recorded"
    assert cfg.buffer.review_retired_every == 0 and cfg.buffer.review_fraction == 0.1


def test_overrides_are_read():
    cfg = load_config("tiny", ["selection.mu=0.25", "loss.replay_old_logprobs=current",
                               "buffer.review_retired_every=25", "buffer.review_fraction=0.2"])
    assert cfg.selection.mu == 0.25 and cfg.loss.replay_old_logprobs == "current"
    assert cfg.buffer.review_retired_every == 25 and cfg.buffer.review_fraction == 0.2


@pytest.mark.parametrize("override, key", [("selection.mu=1.5", r"selection\.mu"),
                                           ("selection.mu=-0.1", r"selection\.mu"),
                                           ("loss.replay_old_logprobs=sampler", r"loss\.replay_old_logprobs"),
                                           ("buffer.review_retired_every=-1", r"buffer\.review_retired_every"),
                                           ("buffer.review_fraction=0", r"buffer\.review_fraction"),
                                           ("buffer.review_fraction=1.5", r"buffer\.review_fraction")])
def test_bad_values_are_one_line_errors(override, key):
    with pytest.raises(ConfigError, match=key) as e:
        load_config("tiny", [override])
    lines = str(e.value).strip().splitlines()  # the loader's header, then one line for the key
    assert len(lines) == 2 and lines[1].strip().startswith(override.split("=")[0] + ":"), lines
