"""The engine's own decode loop (`rollout/decode.py`): finished rows leave the batch without changing
any sample, the in-place cache equals concatenation, and the inverse-CDF sampler draws from the
processed distribution (the samples differ from transformers' `generate`, which draws differently
from the random stream: that change is tested as a distribution, not token for token)."""

import pytest
import torch
from transformers import TopKLogitsWarper, TopPLogitsWarper

from exgrpo_core.models.build import build_tiny_model, build_tiny_tokenizer
from exgrpo_core.rollout.decode import filter_logits, inverse_cdf
from exgrpo_core.rollout.engine import TransformersEngine


@pytest.fixture(scope="module")
def engine():
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, seed=0)
    return TransformersEngine(model, tok, batch_size=64)


def _prompts(engine):
    return [engine.tokenizer(t)["input_ids"] for t in ("1+2=", "31+4=", "7*8=", "100-1=")]


def _sample(engine, seed, n=6, max_new_tokens=12, temperature=1.0, **settings):
    saved = {k: getattr(engine, k) for k in settings}
    for k, v in settings.items():
        setattr(engine, k, v)
    try:
        torch.manual_seed(seed)
        before = engine.row_steps
        out = engine.generate(_prompts(engine), n, temperature=temperature, max_new_tokens=max_new_tokens)
        return [g for grp in out for g in grp], engine.row_steps - before
    finally:
        for k, v in saved.items():
            setattr(engine, k, v)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_dropping_finished_rows_keeps_every_sample_and_saves_their_steps(engine, seed, temperature):
    kept, kept_steps = _sample(engine, seed, temperature=temperature, drop_finished=False)
    dropped, dropped_steps = _sample(engine, seed, temperature=temperature, compact_every=1)
    batched, batched_steps = _sample(engine, seed, temperature=temperature, compact_every=4)
    assert [g.response_ids for g in batched] == [g.response_ids for g in dropped]  # compaction every 4 steps
    assert [g.response_ids for g in dropped] == [g.response_ids for g in kept]
    assert [g.truncated for g in dropped] == [g.truncated for g in kept]
    for a, b in zip(dropped, kept):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
        assert a.entropies == pytest.approx(b.entropies, abs=1e-5)
    lengths = [len(g.response_ids) for g in kept]
    assert min(lengths) < max(lengths), "some rows must end early for this test to mean anything"
    assert dropped_steps == sum(lengths) < kept_steps == len(kept) * max(lengths)
    assert dropped_steps <= batched_steps <= kept_steps  # finished rows ride along up to 3 steps


@pytest.mark.parametrize("seed", [0, 3])
def test_in_place_cache_equals_concatenation(engine, seed):
    static, _ = _sample(engine, seed, static_cache=True)
    grown, _ = _sample(engine, seed, static_cache=False)
    unshared, _ = _sample(engine, seed, share_prefill=False)
    assert [g.response_ids for g in static] == [g.response_ids for g in grown] == [g.response_ids for g in unshared]
    for a, b in zip(static, grown):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_inverse_cdf_hits_each_token_in_proportion_to_its_probability():
    probs = torch.softmax(torch.randn(3, 50, generator=torch.Generator().manual_seed(0)) * 2, -1)
    probs[:, 7] = 0.0  # never drawn
    probs = probs / probs.sum(-1, keepdim=True)
    grid = (torch.arange(20000) + 0.5) / 20000  # evenly spread uniforms: counts are N * p up to +-1
    counts = torch.stack([torch.bincount(inverse_cdf(probs[r].expand(20000, -1), grid), minlength=50)
                          for r in range(3)]).float()
    assert (counts - 20000 * probs).abs().max() <= 1.0 + 1e-3
    assert counts[:, 7].sum() == 0
    edge = inverse_cdf(probs[:1], torch.tensor([1.0 - 1e-9]))  # u * total rounding up to the total
    assert probs[0, edge] > 0


def test_filters_keep_the_tokens_transformers_warpers_keep():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 300, generator=g) * 3
    for top_p in (0.5, 0.9, 0.99):
        ours = torch.isfinite(filter_logits(x, 0, top_p))
        theirs = torch.isfinite(TopPLogitsWarper(top_p)(None, x.clone()))
        assert torch.equal(ours, theirs)
    assert torch.equal(torch.isfinite(filter_logits(x, 5, 1.0)), torch.isfinite(TopKLogitsWarper(5)(None, x.clone())))
    assert torch.equal(filter_logits(x, 0, 1.0), x)


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.8)])
def test_own_decoder_samples_the_same_distribution_as_generate(engine, temperature, top_p):
    """First tokens of 3,000 samples of one prompt, by each decoder, against the model's processed
    distribution (logits / T, top-p): Pearson's chi-square fits within 5 standard deviations for both."""
    prompt = _prompts(engine)[1]
    with torch.no_grad():
        logits = engine.model(input_ids=torch.tensor([prompt])).logits[0, -1].float()
    law = torch.softmax(filter_logits((logits / temperature)[None], 0, top_p), -1)[0]  # [V]

    def chi_square(decoder, seed):
        engine.decoder, engine.top_p, engine.batch_size = decoder, top_p, 3000
        try:
            torch.manual_seed(seed)
            gens = engine.generate([prompt], 3000, temperature=temperature, max_new_tokens=1)[0]
        finally:
            engine.decoder, engine.top_p, engine.batch_size = "own", 1.0, 64
        counts = torch.bincount(torch.tensor([g.response_ids[0] for g in gens]), minlength=law.numel()).float()
        assert counts[law == 0].sum() == 0  # nothing outside the nucleus
        for g in gens[:50]:
            assert g.logprobs[0] == pytest.approx(float(law[g.response_ids[0]].log()), abs=1e-4)
        seen = law > 0
        expected = law[seen] * len(gens)
        return float(((counts[seen] - expected) ** 2 / expected).sum()), int(seen.sum()) - 1

    for decoder, seed in (("own", 0), ("generate", 1)):
        stat, dof = chi_square(decoder, seed)
        assert stat < dof + 5 * (2 * dof) ** 0.5, (decoder, stat, dof)


def test_swap_remove_keeps_the_unfinished_rows_and_moves_one_row_per_finished_one():
    from exgrpo_core.rollout.decode import GrowLayer, survivor_order

    done = torch.tensor([False, True, False, True, False, False, True])
    order = survivor_order(done)
    assert sorted(order.tolist()) == [0, 2, 4, 5] and order.tolist()[:1] == [0]
    layer = GrowLayer(reserve=3)
    keys = torch.arange(7.0)[:, None, None, None].expand(7, 2, 4, 5).contiguous()
    layer.update(keys, -keys)
    layer.batch_select_indices(order)
    assert layer.keys[:, 0, 0, 0].tolist() == [float(i) for i in order.tolist()]
    assert torch.equal(layer.values, -keys[order])
    layer.update(torch.zeros(4, 2, 1, 5), torch.zeros(4, 2, 1, 5))  # writes go on in place after the cut
    assert layer.keys.shape == (4, 2, 5, 5) and torch.equal(layer.keys[:, :, :4], keys[order])


def test_a_common_prefix_is_prefilled_once_with_the_same_samples(engine):
    """Prompts that open alike (a chat template's system prompt): the prefix runs once, each distinct
    remainder once, and the samples equal those of prompts prefilled separately."""
    system = engine.tokenizer("12+34=56 78+9=87 ")["input_ids"]
    prompts = [system + engine.tokenizer(q)["input_ids"][1:] for q in ("1+2=", "31+4=", "7*88=")]
    seen = []
    hook = engine.model.get_input_embeddings().register_forward_hook(lambda _m, a, _o: seen.append(a[0].numel()))
    out = {}
    try:
        for share in (True, False):
            engine.share_prefill = share
            seen.clear()
            torch.manual_seed(11)
            out[share] = [g for grp in engine.generate(prompts, 3, temperature=1.0, max_new_tokens=8) for g in grp]
            out[share, "prefill"] = list(seen[:3 if share else 1])
    finally:
        hook.remove()
        engine.share_prefill = True
    assert [g.response_ids for g in out[True]] == [g.response_ids for g in out[False]]
    for a, b in zip(out[True], out[False]):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
        assert a.entropies == pytest.approx(b.entropies, abs=1e-5)
    common = len(system)  # the tiny tokenizer spells these prompts with the system part's tokens first
    rest = max(len(p) for p in prompts) - common
    assert out[True, "prefill"] == [common, 3 * (rest - 1), 9]  # prefix once, 3 remainders, then 9 rows decode
    assert out[False, "prefill"] == [9 * (max(len(p) for p in prompts) - 1)]
