"""Memory plan: parameter counts against real models and hand-worked per-GPU rows."""

import pytest

from exgrpo_core.models import load as models
from exgrpo_core.training import memory_plan as mp


def test_param_count_matches_a_real_model():
    model, _ = models.load_policy("tiny", dtype="float32", seed=0)
    shape = mp.ModelShape.from_hf_config(model.config)
    assert shape.params == sum(p.numel() for p in model.parameters())


def test_qwen25_math_7b_is_7_6b():
    assert mp.QWEN25_MATH_7B.params == pytest.approx(7.6156e9, rel=1e-3)


def test_hand_worked_rows():
    m = mp.ModelShape(layers=2, hidden=8, intermediate=16, heads=2, kv_heads=1, vocab=10, qkv_bias=False)
    # attention 2*64 + 2*8*4 = 192, mlp 3*8*16 = 384, norms 16 -> 592 per layer; emb 2*80; final norm 8
    assert m.params == 2 * 592 + 160 + 8
    assert mp.kv_bytes_per_token(m, tp=1) == 2 * 2 * 1 * 4 * 2
    plan = mp.memory_plan(m, world=2, micro_batch_tokens=100, logits_chunk=50, vllm_tp=1, vllm_gpu_share=0.5,
                          gpu_gib=1.0, prefetch_layers=1)
    gib = mp.GiB
    assert plan.rows["AdamW moments fp32 (sharded)"] == pytest.approx(8 * m.params / 2 / gib)
    assert plan.rows["checkpointed hidden states bf16"] == pytest.approx(2 * 100 * 8 * 2 / gib)
    assert plan.rows["log-prob/entropy chunk fp32 (+grad)"] == pytest.approx(8 * 50 * 10 / gib)
    assert plan.rows["model logits bf16 + their grad"] == pytest.approx(4 * 100 * 10 / gib)
    assert plan.rows["vLLM KV cache"] == pytest.approx(0.5 - 2 * m.params / gib)
    assert "| **total** |" in mp.render(plan)
