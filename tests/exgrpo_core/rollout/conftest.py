"""Fixtures shared by the decoder tests: a transformers engine over a tiny seeded 2-layer model.

`engine` (one per test module) is `make_engine(**ENGINE)`, ENGINE being the module's own settings
(none: the defaults below); `make_engine` builds a fresh one inside a test.
"""

import pytest
import torch

from exgrpo_core.models.build import build_tiny_model, build_tiny_tokenizer
from exgrpo_core.rollout.engine import TransformersEngine


def build_engine(seed: int = 0, *, hidden_size: int = 32, kv_heads: int | None = None, device: str = "cpu",
                 dtype: torch.dtype | None = None, batch_size: int = 64, **config_overrides) -> TransformersEngine:
    """An engine over a tiny model: 2 layers, 4 query heads (`kv_heads` key/value heads: 2 is grouped-query,
    as Qwen2.5), MLP twice the width, `config_overrides` set on its config."""
    tok = build_tiny_tokenizer()
    overrides = {**({"num_key_value_heads": kv_heads} if kv_heads else {}), **config_overrides}
    model = build_tiny_model(tok, hidden_size=hidden_size, num_layers=2, num_heads=4, intermediate_size=2 * hidden_size,
                             seed=seed, config_overrides=overrides or None)
    return TransformersEngine(model.to(device, dtype), tok, batch_size=batch_size)


@pytest.fixture(scope="session")
def make_engine():
    """`build_engine`, for tests that need an engine of their own."""
    return build_engine


@pytest.fixture(scope="module")
def engine(request):
    """The test module's engine: `build_engine(**ENGINE)`, ENGINE a dict in the module (optional)."""
    return build_engine(**getattr(request.module, "ENGINE", {}))
