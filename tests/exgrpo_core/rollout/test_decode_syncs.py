"""Host synchronisations of the own decoder, counted on the CPU (`exgrpo_core/observe/host_syncs.py`): none in a
decode step between compactions (the model's forward included: the decoder passes transformers a
ready 4-D mask), one `nonzero` at each compaction, the same tokens whatever the interval."""

import pytest
import torch

from exgrpo_core.models.build import build_tiny_model, build_tiny_tokenizer
from exgrpo_core.rollout.decode import decode
from exgrpo_core.rollout.engine import TransformersEngine, left_padded
from exgrpo_core.observe.host_syncs import HostSyncCounter
from exgrpo_core.training.forward_parts import cache_of

TEXTS = ("1+2=", "31+4=", "7*8=", "100-1=", "5+5=", "12*3=")


@pytest.fixture(scope="module")
def engine():
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, seed=0,
                             config_overrides={"num_key_value_heads": 2})  # grouped-query, as Qwen2.5
    return TransformersEngine(model, tok, batch_size=64)


def _count(engine, every: int, steps: int = 12, temperature: float = 1.0, scores: bool = True):
    """(syncing operators per decode step, tokens) of one seeded decode; the prefill runs before counting."""
    prompts = [engine.tokenizer(t)["input_ids"] for t in TEXTS for _ in range(4)]
    ids, mask = left_padded(prompts, engine.pad_id, torch.device("cpu"))
    model = engine.model.eval()
    with torch.no_grad():
        pos = (mask[:, :-1].cumsum(-1) - 1).masked_fill(mask[:, :-1] == 0, 1)
        cache = cache_of(model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], position_ids=pos, use_cache=True))
    counter = HostSyncCounter()
    hook = model.register_forward_pre_hook(counter.mark)
    torch.manual_seed(5)
    try:
        with counter:
            out = decode(model, ids, mask, cache, temperature=temperature, max_new_tokens=steps,
                         eos_ids=engine.eos_ids, pad_id=engine.pad_id, scores=scores, compact_every=every)
    finally:
        hook.remove()
    return counter.per_step(), out


@pytest.mark.parametrize("temperature, scores", [(1.0, True), (0.7, False), (0.0, True)])
def test_no_host_sync_between_compactions(engine, temperature, scores):
    per_step, _ = _count(engine, every=4, temperature=temperature, scores=scores)
    assert len(per_step) == 12
    for t, ops in enumerate(per_step):
        # a compaction: one copy of the running flags back to the host (tolist), nothing else
        assert ops == (["tolist"] if (t + 1) % 4 == 0 else []), (t, ops)


def test_compaction_interval_changes_no_sample(engine):
    _, one = _count(engine, every=1)
    _, five = _count(engine, every=5)
    finished = (one.tokens == engine.eos_ids[0]).any(-1)
    assert 0 < int(finished.sum()) < len(finished), "some rows must end early for this test to mean anything"
    width = one.tokens.shape[1]
    assert torch.equal(five.tokens[:, :width], one.tokens)
    assert (five.tokens[:, width:] == engine.pad_id).all()
    assert torch.allclose(five.logprobs[:, :width], one.logprobs, atol=1e-6)
    assert one.row_steps <= five.row_steps


def test_the_interval_and_decoder_come_from_the_config(engine):
    from exgrpo_core.config.schema import ExGRPOConfig
    from exgrpo_core.run.session import _make_engine

    cfg = ExGRPOConfig.model_validate({"rollout": {"decode_compact_every": 5, "decoder": "own"}})
    made = _make_engine(cfg, engine.model, engine.tokenizer, "test")
    assert made.compact_every == 5 and made.decoder == "eager"


@pytest.mark.parametrize("per", [1, 4])
def test_an_engine_call_reads_its_results_back_in_three_copies_whatever_the_rows(engine, per):
    # (the H200 profile counted 768 per call of 256 rows: three per row, for tokens, log-probs and entropies)
    engine.decoder, engine.compact_every, engine.streams = "eager", 64, 1
    prompts = [engine.tokenizer(t)["input_ids"] for t in TEXTS]
    torch.manual_seed(3)
    with HostSyncCounter() as counter:
        out = engine.generate(prompts, per, temperature=1.0, max_new_tokens=8)
    assert sum(len(g) for g in out) == per * len(TEXTS)
    assert counter.counts["tolist"] == 1 + 3  # the decoder's one compaction (at the end), then the results
