"""rollout.rescore=auto: the sampler's log-probs and entropies stand in for the trainer's scoring pass.

Run: .venv/bin/python -m pytest tests/exgrpo_core/test_loop_rescore.py -q
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from exgrpo_core import loop
from exgrpo_core.config_io import load_config
from exgrpo_core.session import open_session


def all_wrong(texts, answers):
    return [(0.0, "wrong")] * len(texts)


@pytest.fixture
def session(tmp_path):
    cfg = load_config("tiny", [f"run.output_dir={tmp_path}", f"run.db_url=sqlite:///{tmp_path / 'x.db'}",
                               "rollout.max_response_tokens=6", "rollout.group_size=4", "train.batch_size=4",
                               "train.mini_batch_size=4", "run.resume=never", "rollout.temperature=0.7"])
    s = open_session(cfg, verify=all_wrong)
    yield s
    s.close()


def _generate(s, plan, rescore, seed=1):
    s.cfg.rollout.rescore = rescore
    torch.manual_seed(seed)
    return loop.generate(s, plan)


def test_auto_skips_the_scoring_pass_and_gives_the_trainers_numbers(session, monkeypatch):
    plan = loop.plan_batch(session)
    calls = []
    scored = loop.score_rollouts
    monkeypatch.setattr(loop, "score_rollouts", lambda *a, **k: (calls.append(1), scored(*a, **k)))
    auto, _ = _generate(session, plan, "auto")
    assert calls == []
    always, _ = _generate(session, plan, "always")
    assert calls == [1]
    assert sum(len(r.response_ids) for r in auto) > len(auto)  # more than one token per response
    for a, b in zip(auto, always):
        assert a.response_ids == b.response_ids  # same samples: scoring runs after sampling
        assert a.behaviour_logprobs == pytest.approx(b.behaviour_logprobs, abs=1e-4)
        assert a.entropy == pytest.approx(b.entropy, abs=1e-4)
        assert a.sampler_logprobs is None  # no second opinion: nothing for TIS to correct
        assert b.sampler_logprobs == pytest.approx(a.behaviour_logprobs, abs=1e-4)  # the sampler's own numbers


@pytest.mark.parametrize("change, expected", [
    ({}, False),
    ({"rescore": "always"}, True),
    ({"top_p": 0.9}, True),
    ({"mixed_precision": "bf16"}, True),
    ({"engine": object()}, True),
    ({"dtype": torch.bfloat16}, True),  # a bf16 model on CPU: no mixed precision, still bf16 sampling
    ({"dtype": torch.float16}, True),
])
def test_rescoring_is_kept_whenever_the_sampler_is_not_the_trainer(session, change, expected):
    for key in ("rescore", "top_p"):
        if key in change:
            setattr(session.cfg.rollout, key, change[key])
    if "dtype" in change:
        session.engine.model.to(change["dtype"])
    fake = SimpleNamespace(cfg=session.cfg, engine=change.get("engine", session.engine),
                           accelerator=SimpleNamespace(mixed_precision=change.get("mixed_precision", "no")))
    assert loop.needs_rescore(fake) is expected
