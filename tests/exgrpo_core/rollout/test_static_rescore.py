"""A bf16 sampling copy (the static decoder) makes the sampler's numbers differ from the float32
trainer's: `loop.needs_rescore` must then run the trainer's scoring forward."""

import torch

from exgrpo_core.models.build import build_tiny_model, build_tiny_tokenizer
from exgrpo_core.rollout.engine import TransformersEngine
from exgrpo_core.rollout.static_decode import InferenceCopy


def _engine():
    tok = build_tiny_tokenizer()
    return TransformersEngine(build_tiny_model(tok, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64), tok)


def test_a_bf16_sampling_copy_forces_the_rescore():
    """The sampler's numbers then are not the float32 trainer's: the loop's scoring forward must run."""
    from types import SimpleNamespace

    from exgrpo_core import loop

    engine = _engine()
    fake = SimpleNamespace(cfg=SimpleNamespace(rollout=SimpleNamespace(rescore="auto", top_p=1.0)), engine=engine,
                           accelerator=SimpleNamespace(mixed_precision="no"))
    prompts = [engine.tokenizer("1+2=")["input_ids"]]
    for decoder, dtype, expected in (("eager", torch.bfloat16, False), ("static", torch.bfloat16, True),
                                     ("static", torch.float32, False)):
        engine.decoder, engine.inference = decoder, InferenceCopy(dtype)
        engine.generate(prompts, 2, temperature=1.0, max_new_tokens=2)
        assert loop.needs_rescore(fake) is expected, (decoder, dtype)
