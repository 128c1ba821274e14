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


def test_phases_hold_what_sits_on_the_gpu_then():
    m = mp.ModelShape(layers=2, hidden=8, intermediate=16, heads=2, kv_heads=1, vocab=10, qkv_bias=False)
    kw = dict(world=2, micro_batch_tokens=100, logits_chunk=50, vllm_tp=1, vllm_gpu_share=0.5, gpu_gib=1.0)
    awake, asleep = mp.memory_plan(m, **kw), mp.memory_plan(m, vllm_sleep=True, **kw)
    assert list(awake.phases) == ["sampling", "scoring", "optimiser step"]
    assert "gradients fp32 (sharded)" not in awake.phases["sampling"]  # freed after each optimiser step
    assert "vLLM KV cache" in awake.phases["optimiser step"] and "vLLM KV cache" not in asleep.phases["optimiser step"]
    assert asleep.phases["sampling"] == awake.phases["sampling"]  # sleep frees memory only while the engine is idle
    whole = mp.memory_plan(m, unsharded_grad_accumulation=True, **kw).rows
    assert whole["gradients fp32 (whole, accumulated unsharded)"] == pytest.approx(4 * m.params / mp.GiB)
    assert awake.total == max(sum(r.values()) for r in awake.phases.values())


def test_the_paper_preset_fits_80_gb_with_margin_in_every_phase():
    from exgrpo_core.config.load import load_config

    cfg = load_config("paper", [])
    assert cfg.rollout.vllm_sleep and cfg.train.micro_batch_tokens
    kw = dict(world=8, micro_batch_tokens=cfg.train.micro_batch_tokens, logits_chunk=1024,
              vllm_tp=cfg.rollout.vllm_tensor_parallel_size, vllm_gpu_share=cfg.rollout.vllm_gpu_memory_utilization)
    plan = mp.memory_plan(mp.QWEN25_MATH_7B, vllm_sleep=cfg.rollout.vllm_sleep, **kw)
    assert plan.total < 0.8 * 80  # at least 16 GiB to spare (allocator slack, NCCL buffers, CUDA context)
    before = mp.memory_plan(mp.QWEN25_MATH_7B, vllm_sleep=False, unsharded_grad_accumulation=True, **kw)
    assert before.total > 80  # gradient sync off between micro-batches and the engine awake: did not fit
