"""vLLM engine: the mapping from vLLM outputs to our records (runs everywhere, with vLLM-shaped
objects), and a real engine test on a CUDA machine with vLLM installed (marked gpu)."""

from __future__ import annotations

import importlib.util
import math
from types import SimpleNamespace as NS

import pytest

from exgrpo_core.rollout.vllm_engine import (VLLMEngine, VLLMUnavailable, generation_from_vllm, probe_gap,
                                      prompt_logprobs_from_vllm)

EOS = [2]


def _lp(x):
    return NS(logprob=x, rank=1, decoded_token=None)


def _completion(ids, logps, finish):
    return NS(token_ids=ids, logprobs=[{t: _lp(v), 99: _lp(-9.0)} for t, v in zip(ids, logps)],
              finish_reason=finish, text="ignored")


def _decode(ids):
    return " ".join(map(str, ids))


def test_stopped_response_keeps_eos_and_sampled_logprobs():
    g = generation_from_vllm(_completion([5, 6, 2], [-0.1, -0.2, -0.3], "stop"), eos_ids=EOS,
                             max_new_tokens=8, decode=_decode)
    assert g.response_ids == [5, 6, 2]
    assert g.logprobs == pytest.approx([-0.1, -0.2, -0.3])
    assert not g.truncated
    assert g.text == "5 6 2"


def test_length_stop_is_truncated():
    g = generation_from_vllm(_completion([5, 6, 7], [-1.0, -1.0, -1.0], "length"), eos_ids=EOS,
                             max_new_tokens=3, decode=_decode)
    assert g.truncated and g.response_ids == [5, 6, 7]


def test_tokens_after_first_eos_are_dropped():
    g = generation_from_vllm(_completion([5, 2, 8], [-0.5, -0.25, -3.0], "stop"), eos_ids=EOS,
                             max_new_tokens=8, decode=_decode)
    assert g.response_ids == [5, 2] and g.logprobs == [-0.5, -0.25] and not g.truncated


def test_float_logprobs_and_missing_token_error():
    c = NS(token_ids=[4], logprobs=[-0.7], finish_reason="length")
    assert generation_from_vllm(c, eos_ids=EOS, max_new_tokens=1, decode=_decode).logprobs == [-0.7]
    bad = NS(token_ids=[4], logprobs=[{5: _lp(-1.0)}], finish_reason="length")
    with pytest.raises(ValueError, match="sampled token 4"):
        generation_from_vllm(bad, eos_ids=EOS, max_new_tokens=1, decode=_decode)
    none = NS(token_ids=[4], logprobs=None, finish_reason="length")
    with pytest.raises(ValueError, match="logprobs=0"):
        generation_from_vllm(none, eos_ids=EOS, max_new_tokens=1, decode=_decode)


def test_prompt_logprobs_and_probe_gap():
    ids = [1, 5, 6]
    out = NS(prompt_logprobs=[None, {5: _lp(-0.5)}, {6: _lp(-1.5), 7: _lp(-0.2)}])
    assert prompt_logprobs_from_vllm(out, ids) == [-0.5, -1.5]
    assert probe_gap([-0.5, -1.5], [-0.5, -1.0]) == pytest.approx(0.25)
    assert probe_gap([-1.0], [-1.0]) == 0.0
    with pytest.raises(ValueError, match="prompt_logprobs=0"):
        prompt_logprobs_from_vllm(NS(prompt_logprobs=None), ids)
    with pytest.raises(ValueError, match="lengths differ"):
        probe_gap([-1.0], [])
    assert math.isinf(generation_from_vllm(
        NS(token_ids=[3], logprobs=[{3: NS(logprob=None)}], finish_reason="length"),
        eos_ids=EOS, max_new_tokens=1, decode=_decode).logprobs[0])


def _has_cuda_vllm() -> bool:
    if importlib.util.find_spec("vllm") is None:
        return False
    import torch

    return torch.cuda.is_available()


def test_engine_refuses_clearly_without_vllm_or_gpu():
    if _has_cuda_vllm():
        pytest.skip("this machine can run vLLM; the refusal path is for CPU machines")
    with pytest.raises(VLLMUnavailable, match="vllm|CUDA"):
        VLLMEngine("unused", tokenizer=None)


@pytest.mark.gpu
@pytest.mark.skipif(not _has_cuda_vllm(), reason="needs vLLM and a CUDA GPU")
def test_real_engine_generates_and_syncs(tmp_path):
    import torch

    from exgrpo_core.models import load as models

    model, tok = models.load_policy("tiny", dtype="float32", seed=0)
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    eng = VLLMEngine(str(tmp_path / "m"), tok, gpu_memory_utilization=0.2, dtype="float32", enforce_eager=True)
    groups = eng.generate([[1, 5, 6], [1, 7]], 3, temperature=1.0, max_new_tokens=4)
    assert [len(g) for g in groups] == [3, 3]
    assert all(len(g.response_ids) == len(g.logprobs) <= 4 for grp in groups for g in grp)
    probe = [1, 5, 6, 7, 8]
    before = eng.probe(probe)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    assert eng.push_weights(model.named_parameters()) > 0
    after = eng.probe(probe)
    trainer = torch.log_softmax(model(torch.tensor([probe])).logits[0, :-1].float(), -1)
    trainer = trainer.gather(-1, torch.tensor(probe[1:])[:, None])[:, 0].tolist()
    assert probe_gap(after, trainer) < 1e-2 < probe_gap(before, trainer)


def test_vllm_engine_config_fails_clearly_on_cpu(tmp_path):
    if _has_cuda_vllm():
        pytest.skip("this machine can run vLLM")
    from exgrpo_core.config.load import load_config
    from exgrpo_core.run.session import open_session

    cfg = load_config("tiny", [f"run.output_dir={tmp_path}", f"run.db_url=sqlite:///{tmp_path / 'e.db'}",
                               "rollout.engine=vllm"])
    with pytest.raises(VLLMUnavailable, match="exgrpo\\[vllm\\]|CUDA"):
        open_session(cfg, verify=lambda *a, **k: None)
