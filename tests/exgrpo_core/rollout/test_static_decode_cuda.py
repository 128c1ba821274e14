"""The static decoder on a CUDA GPU (marked gpu; skips with a reason elsewhere): its step compiled with
`torch.compile(mode="reduce-overhead")` (CUDA graphs) samples the eager decoder's tokens from a float32
copy, a bf16 copy agrees with the float32 model greedily, and `auto` picks it on CUDA.

Run on a GPU machine: python -m pytest tests/exgrpo_core/rollout/test_static_decode_cuda.py -q
"""

import pytest
import torch

from exgrpo_core.rollout.static_decode import InferenceCopy, StaticDecoder

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
TEXTS = ("1+2=", "31+4=", "7*8=", "100-1=", "5+5=", "12*3=")
ENGINE = {"hidden_size": 64, "kv_heads": 2, "device": "cuda", "batch_size": 32}  # the `engine` fixture (conftest.py)


def _run(engine, decoder, seed, temperature=1.0, max_new_tokens=24):
    engine.decoder = decoder
    torch.manual_seed(seed)
    prompts = [engine.tokenizer(t)["input_ids"] for t in TEXTS]
    out = engine.generate(prompts, 4, temperature=temperature, max_new_tokens=max_new_tokens)
    return [g for grp in out for g in grp]


def test_compiled_float32_copy_samples_the_eager_tokens(engine):
    assert engine.sampling_path(torch.device("cuda")) == "static"
    engine.inference, engine.static = InferenceCopy(torch.float32), StaticDecoder(compile_step=True)
    for seed in (0, 1):  # the second call replays the captured graphs
        eager = _run(engine, "eager", seed)
        static = _run(engine, "static", seed)
        same = sum(a.response_ids == b.response_ids for a, b in zip(static, eager))
        assert same >= len(eager) - 1, (seed, same)  # (TF32 / kernel choice may flip a near tie)
        for a, b in zip(static, eager):
            if a.response_ids == b.response_ids:
                assert a.logprobs == pytest.approx(b.logprobs, abs=1e-3)


def test_compiled_bf16_copy_agrees_greedily(engine):
    engine.inference, engine.static = InferenceCopy(torch.bfloat16), StaticDecoder(compile_step=True)
    eager = _run(engine, "eager", 0, temperature=0.0, max_new_tokens=16)
    static = _run(engine, "static", 0, temperature=0.0, max_new_tokens=16)
    firsts = sum(a.response_ids[:4] == b.response_ids[:4] for a, b in zip(static, eager))
    assert firsts >= 0.9 * len(eager), firsts
    assert engine.inference.module.dtype == torch.bfloat16
