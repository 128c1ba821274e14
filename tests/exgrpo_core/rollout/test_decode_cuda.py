"""The own decode loop on a CUDA GPU (marked gpu; skips with a reason elsewhere): with the same uniforms
it samples the same tokens as on the CPU, dropping finished rows, the in-place cache and the shared
prefix change no sample there either, and a bf16 model decodes through the engine.

Run on a GPU machine: python -m pytest tests/exgrpo_core/rollout/test_decode_cuda.py -q
"""

import pytest
import torch

from exgrpo_core.rollout.decode import decode, prefix_prefill
from exgrpo_core.rollout.engine import left_padded

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
TEXTS = ("1+2=", "31+4=", "7*8=", "100-1=", "5+5=", "12*3=")  # (the `engine` fixture: conftest.py's default)


def _decode_on(engine, device, uniforms, temperature=1.0, max_new_tokens=12, **kw):
    engine.model.to(device)
    prompts = [engine.tokenizer(t)["input_ids"] for t in TEXTS for _ in range(4)]
    ids, mask = left_padded(prompts, engine.pad_id, torch.device(device))
    return decode(engine.model, ids, mask, None, temperature=temperature, max_new_tokens=max_new_tokens,
                  eos_ids=engine.eos_ids, pad_id=engine.pad_id, uniforms=uniforms.to(device), **kw)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_cuda_samples_the_cpu_tokens_for_the_same_uniforms(engine, temperature):
    torch.manual_seed(0)
    uniforms = torch.rand(12, 4 * len(TEXTS))
    cpu = _decode_on(engine, "cpu", uniforms, temperature)
    gpu = _decode_on(engine, "cuda", uniforms, temperature)
    engine.model.to("cpu")
    assert gpu.tokens.device.type == "cuda"
    assert torch.equal(gpu.tokens.cpu(), cpu.tokens)
    assert gpu.row_steps == cpu.row_steps
    assert torch.allclose(gpu.logprobs.cpu(), cpu.logprobs, atol=1e-4)
    assert torch.allclose(gpu.entropies.cpu(), cpu.entropies, atol=1e-4)
    if temperature > 0:  # (greedy rows of this model never reach an end token)
        lengths = (cpu.tokens != engine.pad_id).sum(-1)
        assert int(lengths.min()) < int(lengths.max()), "some rows must end early for this test to mean anything"


def test_on_cuda_dropping_rows_the_in_place_cache_and_the_shared_prefix_change_no_sample(engine):
    torch.manual_seed(1)
    uniforms = torch.rand(12, 4 * len(TEXTS)).cuda()
    plain = _decode_on(engine, "cuda", uniforms, compact_every=1)  # (12 steps: the default 16 never compacts)
    kept = _decode_on(engine, "cuda", uniforms, drop_finished=False, compact_every=1)
    grown = _decode_on(engine, "cuda", uniforms, static_cache=False, compact_every=1)
    prompts = [engine.tokenizer("12+34=56 " + t)["input_ids"] for t in TEXTS for _ in range(4)]
    shared = prefix_prefill(engine.model, prompts, engine.pad_id, 1)
    assert shared is not None and shared[0].device.type == "cuda"
    ids, mask = left_padded(prompts, engine.pad_id, torch.device("cuda"))
    args = dict(temperature=1.0, max_new_tokens=12, eos_ids=engine.eos_ids, pad_id=engine.pad_id, uniforms=uniforms)
    with_prefix = decode(engine.model, *shared, **args)
    without = decode(engine.model, ids, mask, None, **args)
    engine.model.to("cpu")
    assert torch.equal(kept.tokens, plain.tokens) and torch.equal(grown.tokens, plain.tokens)
    assert plain.row_steps < kept.row_steps
    assert torch.equal(with_prefix.tokens, without.tokens)
    assert torch.allclose(with_prefix.logprobs, without.logprobs, atol=1e-4)


def test_a_bf16_model_decodes_on_cuda_through_the_engine(make_engine):
    bf16 = make_engine(device="cuda", dtype=torch.bfloat16, batch_size=8)
    tok = bf16.tokenizer
    bf16.decoder = "eager"  # (auto picks the static decoder on CUDA: test_static_decode_cuda.py)
    bf16.compact_every = 1  # (rows leave at once, so computed row-steps = response tokens)
    torch.manual_seed(2)
    out = bf16.generate([tok(t)["input_ids"] for t in TEXTS], 4, temperature=1.0, max_new_tokens=10)
    assert [len(g) for g in out] == [4] * len(TEXTS)
    gens = [g for grp in out for g in grp]
    assert all(1 <= len(g.response_ids) <= 10 and len(g.logprobs) == len(g.response_ids) for g in gens)
    assert all(lp <= 1e-6 for g in gens for lp in g.logprobs) and all(e >= -1e-6 for g in gens for e in g.entropies)
    assert bf16.row_steps == sum(len(g.response_ids) for g in gens)
