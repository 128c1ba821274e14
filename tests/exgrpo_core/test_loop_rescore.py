"""rollout.rescore=auto: the sampler's log-probs and entropies stand in for the trainer's scoring pass.

Run: .venv/bin/python -m pytest tests/exgrpo_core/test_loop_rescore.py -q
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from exgrpo_core import loop
from exgrpo_core.config.load import load_config
from exgrpo_core.run.session import open_session
from exgrpo_core.types import Rollout


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


def test_the_models_own_generation_config_does_not_change_what_is_sampled(session):
    """Issue 14 item 2: a model shipping `repetition_penalty` / `no_repeat_ngram_size` in its generation
    config (Qwen2.5-7B-Instruct: 1.05) must still be sampled from the policy: the stored behaviour
    log-probs (rescore=auto, the sampler's) equal the trainer's, which the first mini-batch's ratio uses."""
    gen_cfg = session.engine.model.generation_config
    gen_cfg.repetition_penalty, gen_cfg.no_repeat_ngram_size = 1.5, 2
    try:
        plan = loop.plan_batch(session)
        auto, _ = _generate(session, plan, "auto", seed=5)
        trainer = [Rollout(r.question_uid, r.prompt_ids, r.response_ids, list(r.behaviour_logprobs), r.text,
                                r.truncated, r.step) for r in auto]
        loop.score_rollouts(session, trainer)  # the trainer's forward: what the loss's new log-probs are at step 0
    finally:
        gen_cfg.repetition_penalty, gen_cfg.no_repeat_ngram_size = 1.0, 0
    assert sum(len(r.response_ids) for r in auto) > 2 * len(auto)  # repeats are likely: the penalty would show
    for a, t in zip(auto, trainer):
        assert a.behaviour_logprobs == pytest.approx(t.behaviour_logprobs, abs=1e-4)
        assert a.entropy == pytest.approx(t.entropy, abs=1e-4)
    assert session.engine.model.generation_config is gen_cfg  # the model's own config is put back


def test_a_logits_processor_asked_for_forces_the_rescore(session):
    from transformers import RepetitionPenaltyLogitsProcessor

    fake = SimpleNamespace(cfg=session.cfg, engine=session.engine, accelerator=SimpleNamespace(mixed_precision="no"))
    assert loop.needs_rescore(fake) is False
    session.engine.logits_processors = [RepetitionPenaltyLogitsProcessor(1.5)]
    try:
        assert loop.needs_rescore(fake) is True
        plan = loop.plan_batch(session)
        processed, _ = _generate(session, plan, "auto", seed=5)
    finally:
        session.engine.logits_processors = []
    gap = max(abs(a - b) for r in processed for a, b in zip(r.behaviour_logprobs, r.sampler_logprobs))
    assert gap > 1e-3  # the trainer's numbers were stored, the processed sampler's kept apart for TIS
