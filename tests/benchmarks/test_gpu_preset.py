"""The real-shape GPU preset (configs/gpu-qwen0.5b-shape.yaml): Qwen2.5-0.5B's vocabulary, GQA and size,
built locally (no download)."""

from __future__ import annotations

import pytest

from exgrpo_core.config.load import load_config
from exgrpo_core.models.load import load_policy, policy_config
from exgrpo_core.training.memory_plan import ModelShape

PRESET = "gpu-qwen0.5b-shape"


def test_preset_has_the_qwen25_05b_shape():
    cfg = load_config(PRESET)
    c = policy_config(cfg.model.name_or_path, tiny=cfg.model.tiny.model_dump(), hf_overrides=cfg.model.hf_overrides)
    assert (c.vocab_size, c.hidden_size, c.num_hidden_layers) == (151936, 896, 24)
    assert (c.num_attention_heads, c.num_key_value_heads, c.intermediate_size) == (14, 2, 4864)
    assert c.tie_word_embeddings and c.attention_bias and c.rope_parameters["rope_theta"] == 1e6
    shape = ModelShape.from_hf_config(c)
    assert shape.params == pytest.approx(494.03e6, rel=1e-3)  # Qwen2.5-0.5B: 494M (o_proj bias: +21.5k)


def test_preset_builds_shrunk_with_the_real_vocabulary_and_gqa():
    cfg = load_config(PRESET, ["model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=4",
                               "model.tiny.intermediate_size=64", "model.dtype=float32"])
    model, tok = load_policy(cfg.model.name_or_path, dtype=cfg.model.dtype, tiny=cfg.model.tiny.model_dump(),
                             hf_overrides=cfg.model.hf_overrides)
    assert model.config.vocab_size == 151936 and model.lm_head.weight.shape == (151936, 32)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied
    attn = model.model.layers[0].self_attn
    assert attn.k_proj.weight.shape == (2 * 8, 32) and attn.q_proj.weight.shape == (32, 32)  # 2 KV heads of 4
    assert attn.q_proj.bias is not None
    import torch

    out = model(input_ids=torch.tensor([tok("2+3=")["input_ids"]])).logits
    assert out.shape[-1] == 151936
