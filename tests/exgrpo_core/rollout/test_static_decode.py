"""The static (GPU) sampling path on the CPU, where its step runs eagerly (`rollout/static_decode.py`):
the eager decoder's tokens from a float32 copy, greedy agreement and a small log-prob gap from a bf16
copy, key/value heads not expanded for a grouped-query model, no host sync between end checks, and
an inference copy that equals the bf16 cast of the masters after each optimiser step."""

import pytest
import torch

from exgrpo_core.observe.host_syncs import HostSyncCounter
from exgrpo_core.rollout.static_decode import InferenceCopy

TEXTS = ("1+2=", "31+4=", "7*8=", "100-1=", "5+5=")
ENGINE = {"kv_heads": 2}  # the `engine` fixture (conftest.py): grouped-query, as Qwen2.5


def _run(engine, decoder, seed, dtype=torch.float32, temperature=1.0, top_p=1.0, n=4, max_new_tokens=12):
    engine.decoder, engine.top_p = decoder, top_p
    if engine.inference.dtype != dtype:
        engine.inference = InferenceCopy(dtype)
    try:
        torch.manual_seed(seed)
        prompts = [engine.tokenizer(t)["input_ids"] for t in TEXTS]
        out = engine.generate(prompts, n, temperature=temperature, max_new_tokens=max_new_tokens)
        return [g for grp in out for g in grp], float(torch.rand(1))
    finally:
        engine.decoder, engine.top_p = "auto", 1.0


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.8), (0.0, 1.0)])
def test_float32_copy_samples_the_eager_tokens(engine, seed, temperature, top_p):
    eager, after_eager = _run(engine, "eager", seed, temperature=temperature, top_p=top_p)
    static, after_static = _run(engine, "static", seed, temperature=temperature, top_p=top_p)
    assert [g.response_ids for g in static] == [g.response_ids for g in eager]
    assert [g.truncated for g in static] == [g.truncated for g in eager]
    for a, b in zip(static, eager):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
        assert a.entropies == pytest.approx(b.entropies, abs=1e-5)
    assert after_static == after_eager  # the random stream left where the eager decoder leaves it
    if temperature > 0:
        assert len({tuple(g.response_ids) for g in eager}) > 3


def test_bf16_copy_agrees_with_the_eager_float32_model(engine):
    """Greedy: most rows equal token for token; over all positions the bf16 copy's log-probs of the
    tokens it chose stay within 0.05 nats of the float32 model's for the same tokens."""
    eager, _ = _run(engine, "eager", 0, temperature=0.0, n=1, max_new_tokens=16)
    half, _ = _run(engine, "static", 0, dtype=torch.bfloat16, temperature=0.0, n=1, max_new_tokens=16)
    same = sum(a.response_ids == b.response_ids for a, b in zip(half, eager))
    assert same >= len(eager) - 1, (same, len(eager))
    model = engine.model
    gaps = []
    with torch.no_grad():
        for text, g in zip(TEXTS, half):
            prompt = engine.tokenizer(text)["input_ids"]
            ids = torch.tensor([prompt + g.response_ids])
            logp = torch.log_softmax(model(input_ids=ids).logits[0, len(prompt) - 1:-1].float(), -1)
            ref = logp.gather(-1, torch.tensor(g.response_ids)[:, None]).squeeze(-1)
            gaps.append((ref - torch.tensor(g.logprobs)).abs().max())
    assert max(gaps) < 0.05, gaps


def test_grouped_query_attention_reads_the_cache_unexpanded(engine):
    """Every SDPA call of a decode step gets the 2 key/value heads as cached, not 4 copies."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Shapes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if "scaled_dot_product" in func.overloadpacket.__name__:
                self.seen.append((tuple(args[0].shape), tuple(args[1].shape)))
            return func(*args, **(kwargs or {}))

    with Shapes() as shapes:
        _run(engine, "static", 0, n=2, max_new_tokens=4)
    steps = [(q, k) for q, k in shapes.seen if q[2] != k[2] and q[2] == 2]  # grouped decode queries [b, 2, 2, d]
    assert len(steps) == 4 * 2  # 4 steps x 2 layers
    assert all(k[1] == 2 for _, k in steps)


def test_no_host_sync_between_end_checks(engine):
    counter = HostSyncCounter()
    engine.decoder, engine.compact_every = "static", 4
    prompts = [engine.tokenizer(t)["input_ids"] for t in TEXTS]
    engine.inference.refresh(engine.model, torch.device("cpu"))
    hook = engine.inference.module.register_forward_pre_hook(counter.mark)
    try:
        torch.manual_seed(0)
        with counter:
            engine.generate(prompts, 3, temperature=1.0, max_new_tokens=12)
    finally:
        hook.remove()
        engine.decoder, engine.compact_every = "auto", 16
    per_step = counter.per_step()[1:]  # the first forward is the prefill
    assert len(per_step) == 12
    for t, ops in enumerate(per_step[:-1]):
        assert ops == (["nonzero"] if (t + 1) % 4 == 0 else []), (t, ops)
    assert per_step[-1][0] == "nonzero"  # the last end check; the rest reads the finished samples back


@pytest.mark.parametrize("tied", [False, True])
def test_inference_copy_is_the_bf16_cast_of_the_masters_after_each_step(make_engine, tied):
    engine = make_engine(1, kv_heads=2, tie_word_embeddings=tied)
    assert (engine.model.lm_head.weight is engine.model.get_input_embeddings().weight) == tied
    engine.decoder = "static"
    prompts = [engine.tokenizer(t)["input_ids"] for t in TEXTS[:2]]
    opt = torch.optim.AdamW(engine.model.parameters(), lr=1e-2)
    for step in range(2):
        engine.generate(prompts, 2, temperature=1.0, max_new_tokens=4)
        copy = engine.inference.module
        for (name, mine), (_, master) in zip(copy.named_parameters(), engine.model.named_parameters()):
            assert mine.dtype == torch.bfloat16 and master.dtype == torch.float32, name
            assert torch.equal(mine, master.detach().to(torch.bfloat16)), name
            assert mine.data_ptr() != master.data_ptr()
        ids = torch.tensor([prompts[0]])
        loss = engine.model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        stale = sum(not torch.equal(m, p.detach().to(torch.bfloat16))
                    for m, p in zip(copy.parameters(), engine.model.parameters()))
        assert stale > 0  # the step moved the masters; the next generate must refresh the copy
    assert engine.inference.refreshes == 2 and engine.inference_dtype == torch.bfloat16
    copy = engine.inference.module
    assert (copy.lm_head.weight is copy.get_input_embeddings().weight) == tied


def test_the_copy_is_refreshed_only_when_the_weights_changed(make_engine):
    """Two `generate` calls with no optimiser step between them (an evaluation after a rollout) copy the
    weights once; a step (here fused AdamW, which writes without bumping tensor versions) or a loaded
    state makes the next call copy them again. Samples are those of a copy made for the call."""
    engine, ref = make_engine(3, kv_heads=2), make_engine(3, kv_heads=2)
    engine.decoder = ref.decoder = "static"
    prompts = [engine.tokenizer(t)["input_ids"] for t in TEXTS[:3]]
    start = {k: v.clone() for k, v in engine.model.state_dict().items()}

    def sample(e, seed, fresh=False):
        if fresh:  # a copy made for this call: what every call did before
            e.model.load_state_dict(engine.model.state_dict())
            e.inference = InferenceCopy()
        torch.manual_seed(seed)
        out = e.generate(prompts, 2, temperature=1.0, max_new_tokens=6)
        return [(g.response_ids, g.logprobs) for grp in out for g in grp]

    first, second = sample(engine, 0), sample(engine, 1)
    assert engine.inference.refreshes == 1
    assert first == sample(ref, 0, fresh=True) and second == sample(ref, 1, fresh=True)
    opt = torch.optim.AdamW(engine.model.parameters(), lr=1e-2, fused=True)
    ids = torch.tensor([prompts[0]])
    engine.model(input_ids=ids, labels=ids).loss.backward()
    before = [p._version for p in engine.model.parameters()]
    opt.step()
    opt.zero_grad()
    assert [p._version for p in engine.model.parameters()] == before  # the fused step leaves versions alone
    third = sample(engine, 1)
    assert engine.inference.refreshes == 2 and third != second
    assert third == sample(ref, 1, fresh=True)
    sample(engine, 2)
    assert engine.inference.refreshes == 2
    engine.model.load_state_dict(start)  # e.g. a checkpoint loaded: the first weights again
    assert sample(engine, 0) == first and engine.inference.refreshes == 3
    for mine, master in zip(engine.inference.module.parameters(), engine.model.parameters()):
        assert torch.equal(mine, master.detach().to(torch.bfloat16))


def test_a_shorter_call_reuses_the_longer_cache_and_samples_alike(engine):
    """Shapes stay those captured: after a 140-token call (cache 256 long) a 12-token call decodes in
    the same cache buffers, with the eager decoder's tokens."""
    engine.static.caches.clear()
    _run(engine, "static", 0, max_new_tokens=140)
    (cache, length), = engine.static.caches.values()
    ptr = cache.layers[0].keys.data_ptr()
    static, _ = _run(engine, "static", 1)
    eager, _ = _run(engine, "eager", 1)
    (again, again_length), = engine.static.caches.values()
    assert again is cache and again_length == length == 256 and again.layers[0].keys.data_ptr() == ptr
    assert [g.response_ids for g in static] == [g.response_ids for g in eager]


def test_a_step_attends_over_its_length_bucket_only(engine):
    """A 140-token call (cache 256 long): the steps while at most 128 positions are filled read 128 cached
    keys, later ones 256 (one compiled graph per bucket on CUDA); the eager decoder's tokens either way."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class KeyLengths(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if "scaled_dot_product" in func.overloadpacket.__name__ and args[0].shape[1:3] == (2, 2):
                self.seen.append(args[1].shape[2])  # a grouped decode query [b, 2, 2, d]: the keys it reads
            return func(*args, **(kwargs or {}))

    engine.static.caches.clear()
    with KeyLengths() as keys:
        static, _ = _run(engine, "static", 3, max_new_tokens=140)
    eager, _ = _run(engine, "eager", 3, max_new_tokens=140)
    assert [g.response_ids for g in static] == [g.response_ids for g in eager]
    w = max(len(engine.tokenizer(t)["input_ids"]) for t in TEXTS)
    steps = len(keys.seen) // 2  # 2 layers
    assert steps > 128 - w + 1, steps  # some row runs past 128 filled positions
    assert keys.seen == [128 if w + t <= 128 else 256 for t in range(steps) for _ in range(2)]
    assert engine.static.span(1, 2048) == 128 and engine.static.span(300, 2048) == 512
    assert engine.static.span(300, 384) == 384


def test_sampling_path_choice(engine):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert engine.sampling_path(cpu) == "eager" and engine.sampling_path(cuda) == "static"
    engine.decoder = "own"
    assert engine.sampling_path(cuda) == "eager"
    engine.decoder = "static"
    engine.logits_processors.append(lambda ids, x: x)
    try:
        with pytest.raises(ValueError, match="no logits processors"):
            engine.sampling_path(cpu)
        engine.decoder = "auto"
        assert engine.sampling_path(cuda) == "eager"
    finally:
        engine.logits_processors.clear()
        engine.decoder = "auto"


def test_the_copy_of_an_fsdp2_sharded_policy_is_gathered_once_and_samples_like_the_plain_one(make_engine):
    """One gloo process: the copy is built as the model's own class (not FSDP2's subclass), its weights
    are the gathered masters, and its samples are the unsharded policy's."""
    import torch.distributed as dist

    from exgrpo_core.training.fsdp import shard_model

    plain, sharded = make_engine(2, kv_heads=2), make_engine(2, kv_heads=2)
    for e in (plain, sharded):
        e.decoder, e.inference = "static", InferenceCopy(torch.float32)
    prompts = [plain.tokenizer(t)["input_ids"] for t in TEXTS[:3]]
    torch.manual_seed(4)
    want = plain.generate(prompts, 2, temperature=1.0, max_new_tokens=6)
    started = not dist.is_initialized()
    try:
        shard_model(sharded.model, torch.device("cpu"), bf16=False)
        assert type(sharded.model).__name__.startswith("FSDP")
        torch.manual_seed(4)
        got = sharded.generate(prompts, 2, temperature=1.0, max_new_tokens=6)
        sharded.generate(prompts, 1, temperature=1.0, max_new_tokens=2)  # no step since: nothing gathered
        assert sharded.inference.refreshes == 1
    finally:
        if started and dist.is_initialized():
            dist.destroy_process_group()
    assert type(sharded.inference.module) is type(plain.model)
    for (name, a), b in zip(sharded.inference.module.named_parameters(), plain.model.parameters()):
        assert torch.equal(a, b), name
    assert [[g.response_ids for g in grp] for grp in got] == [[g.response_ids for g in grp] for grp in want]
