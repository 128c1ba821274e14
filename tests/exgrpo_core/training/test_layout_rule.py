"""The default training layout by model size and GPU count (training/layout.py)."""

import pytest

from exgrpo_core.training.layout import activation_bytes, train_layout
from exgrpo_core.training.memory_plan import QWEN25_MATH_7B, ModelShape

QWEN25_05B = ModelShape(layers=24, hidden=896, intermediate=4864, heads=14, kv_heads=2, vocab=151936,
                        tied_embeddings=True)
QWEN25_15B = ModelShape(layers=28, hidden=1536, intermediate=8960, heads=12, kv_heads=2, vocab=151936,
                        tied_embeddings=True)


def test_a_model_one_gpu_holds_is_replicated_without_checkpointing():
    got = train_layout(QWEN25_05B, gpus=1, gpu_gib=80, micro_batch_tokens=32768)
    assert (got.sharding, got.gradient_checkpointing) == ("replicate", False)
    assert got.state_gib == pytest.approx(16 * QWEN25_05B.params / 2**30)


def test_one_gpu_is_never_fsdp2_and_checkpoints_when_activations_do_not_fit():
    got = train_layout(QWEN25_15B, gpus=1, gpu_gib=80, micro_batch_tokens=32768)
    assert (got.sharding, got.gradient_checkpointing) == ("replicate", True)
    assert not train_layout(QWEN25_15B, gpus=1, gpu_gib=80, micro_batch_tokens=8192).gradient_checkpointing


def test_the_paper_model_on_eight_gpus_is_sharded_and_checkpointed():
    got = train_layout(QWEN25_MATH_7B, gpus=8, gpu_gib=80, micro_batch_tokens=32768)
    assert (got.sharding, got.gradient_checkpointing) == ("fsdp2", True)
    assert got.state_gib == pytest.approx(16 * QWEN25_MATH_7B.params / 2**30 / 8)


def test_small_models_stay_replicated_on_several_gpus():
    assert train_layout(QWEN25_05B, gpus=8).sharding == "replicate"
    assert train_layout(QWEN25_05B, gpus=8, gpu_gib=16).sharding == "fsdp2"  # 7.4 GiB > 40% of 16


def test_activation_estimate_is_per_token_and_layer():
    one = activation_bytes(QWEN25_05B, 1)
    assert one == 24 * (16 * 896 + 6 * 4864) + 4 * 151936
    assert activation_bytes(QWEN25_05B, 1000) == 1000 * one


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="gpus"):
        train_layout(QWEN25_05B, gpus=0)
