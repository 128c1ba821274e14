"""Decode products on packed oneDNN weights (`rollout.decode_matmul=auto`): the same product as torch's
up to float rounding, rebuilt when the weights change, off where it does not apply, and the same
samples as `torch` for a fixed seed."""

import pytest
import torch

from exgrpo_core.models.build import build_tiny_model, build_tiny_tokenizer
from exgrpo_core.rollout import packed
from exgrpo_core.rollout.engine import TransformersEngine



def _model(seed=0):
    tok = build_tiny_tokenizer()
    return build_tiny_model(tok, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, seed=seed), tok


def _linears(model):
    return [m for m in model.modules() if type(m) is torch.nn.Linear]


@pytest.mark.parametrize("rows", [1, 3, 8, 33])
def test_packed_layers_compute_the_same_product_and_are_restored(rows):
    model, _ = _model()
    layers = _linears(model)
    xs = [torch.randn(2, rows, m.in_features) for m in layers]
    with torch.no_grad():
        want = [torch.nn.functional.linear(x, m.weight, m.bias) for m, x in zip(layers, xs)]
        with packed.packed_linears(model) as n:
            got = [m(x) for m, x in zip(layers, xs)]
    assert n == len(layers) > 0
    for a, b in zip(got, want):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert all("forward" not in vars(m) for m in layers)  # the modules' own forward again


@pytest.mark.parametrize("fused", [True, None])
def test_every_block_packs_the_weights_as_they_are_then(fused):
    model, _ = _model()
    layer = _linears(model)[0]
    x = torch.randn(4, layer.in_features)
    with torch.no_grad(), packed.packed_linears(model):
        before = layer(x)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, fused=fused)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()  # the fused step writes the weights without bumping their version
    with torch.no_grad(), packed.packed_linears(model):
        after_step = layer(x)
    torch.testing.assert_close(after_step, x @ layer.weight.detach().t(), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(after_step, before)
    layer.weight.data = torch.randn_like(layer.weight)  # new storage
    with torch.no_grad(), packed.packed_linears(model):
        torch.testing.assert_close(layer(x), x @ layer.weight.detach().t(), rtol=1e-5, atol=1e-5)


def test_it_stays_off_with_autograd_other_dtypes_or_when_disabled():
    model, _ = _model()
    with packed.packed_linears(model) as n:  # grad enabled: training forwards keep torch's product
        assert n == 0
    with torch.no_grad(), packed.packed_linears(model, enabled=False) as n:
        assert n == 0
    with torch.no_grad(), packed.packed_linears(model.to(torch.bfloat16)) as n:
        assert n == 0


@pytest.mark.parametrize("streams", [1, 2])
def test_engine_samples_the_same_tokens_as_torchs_product(streams):
    model, tok = _model(seed=3)
    engine = TransformersEngine(model, tok, batch_size=64)
    engine.streams, engine.min_stream_rows = streams, 4
    prompts = [tok(t)["input_ids"] for t in ("1+2=", "31+4=", "7*8=", "100-1=", "5+5=", "12*3=")]
    out = {}
    for mode in ("torch", "auto"):
        engine.matmul = mode
        torch.manual_seed(7)
        out[mode] = [g for grp in engine.generate(prompts, 4, temperature=0.8, max_new_tokens=16) for g in grp]
        assert engine.packed_layers == (len(_linears(model)) if mode == "auto" else 0)
    same = [a.response_ids == b.response_ids for a, b in zip(out["auto"], out["torch"])]
    assert sum(same) >= 0.9 * len(same)  # a token may flip only where a draw sits ~1e-6 from a CDF boundary
    assert len({tuple(g.response_ids) for g in out["torch"]}) > 3  # really sampled
    for a, b, s in zip(out["auto"], out["torch"], same):
        if s:
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    assert all("forward" not in vars(m) for m in _linears(model))
