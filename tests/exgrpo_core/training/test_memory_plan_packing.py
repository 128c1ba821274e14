"""Memory plan of packed against padded optimiser-step micro-batches (train.pack_sequences): a packed one
holds its real tokens only, with no attention mask and no shared prompts."""

import importlib.util
from pathlib import Path

import pytest

from exgrpo_core.config.load import load_config
from exgrpo_core.training import memory_plan as mp

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "memory_plan.py"
M = mp.ModelShape(layers=2, hidden=8, intermediate=16, heads=2, kv_heads=1, vocab=10, qkv_bias=False)
KW = dict(world=2, micro_batch_tokens=100, logits_chunk=50, vllm_tp=1, vllm_gpu_share=0.5, gpu_gib=1.0,
          row_tokens=40, shared_prompt_tokens=30)
MASK = "attention mask (bool + one layer's bf16)"
SHARED = ("shared prompts' activations bf16", "shared prompts' K/V copies bf16")


def _script():
    spec = importlib.util.spec_from_file_location("memory_plan_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_padded_micro_batches_hold_a_mask_and_shared_prompts_that_packed_ones_do_not():
    padded, packed = mp.memory_plan(M, packed=False, **KW), mp.memory_plan(M, packed=True, **KW)
    gib = mp.GiB
    assert padded.rows[MASK] == pytest.approx(3 * 100 * 40 / gib)  # rows x l x l, rows x l <= 100
    assert padded.rows[SHARED[0]] == pytest.approx(30 * 2 * (16 * 8 + 6 * 16) / gib)
    assert padded.rows[SHARED[1]] == pytest.approx(30 * mp.kv_bytes_per_token(M, tp=1) / gib)
    assert not {MASK, *SHARED} & set(packed.rows)
    extra = padded.rows[MASK] + sum(padded.rows[k] for k in SHARED)
    assert sum(padded.rows.values()) - sum(packed.rows.values()) == pytest.approx(extra)
    for phase in ("sampling", "scoring"):  # scoring is padded either way
        assert padded.phases[phase] == packed.phases[phase]
    assert packed.notes["optimiser_micro_batches"].startswith("packed: at most 100 real tokens")
    assert padded.notes["optimiser_micro_batches"].startswith("padded")


def test_the_script_plans_the_paper_preset_packed_on_gpus_with_varlen():
    script = _script()
    kw = dict(world=8, gpus_per_machine=8)
    packed = script.plan_for(load_config("paper"), mp.QWEN25_MATH_7B, varlen=True, **kw)
    assert MASK not in packed.rows and packed.notes["optimiser_micro_batches"].startswith("packed")
    without = script.plan_for(load_config("paper"), mp.QWEN25_MATH_7B, varlen=False, **kw)
    padded = script.plan_for(load_config("paper", ["train.pack_sequences=false"]), mp.QWEN25_MATH_7B, **kw)
    for plan in (without, padded):  # 16,384 tokens in rows of up to 1,024 + 8,192: l <= 9,216
        assert plan.rows[MASK] == pytest.approx(3 * 16384 * 9216 / mp.GiB)
        assert not set(SHARED) & set(plan.rows)  # FSDP2 with checkpointing shares no prompts
    assert sum(padded.rows.values()) - sum(packed.rows.values()) == pytest.approx(padded.rows[MASK])


def test_the_script_counts_shared_prompts_only_where_the_run_shares_them():
    script = _script()
    sets = ["train.sharding=replicate", "model.gradient_checkpointing=false", "run.checkpoint_weights=full"]
    kw = dict(world=1, gpus_per_machine=1)
    padded = script.plan_for(load_config("paper", [*sets, "train.pack_sequences=false"]), mp.QWEN25_MATH_7B, **kw)
    assert padded.rows[SHARED[0]] == pytest.approx(4 * 1024 * 28 * (16 * 3584 + 6 * 18944) / mp.GiB)
    packed = script.plan_for(load_config("paper", [*sets, "train.pack_sequences=true"]), mp.QWEN25_MATH_7B, **kw)
    assert not {MASK, *SHARED} & set(packed.rows)
    off = script.plan_for(load_config("paper", [*sets, "train.pack_sequences=false", "train.share_prompt_forward=false"]),
                          mp.QWEN25_MATH_7B, **kw)
    assert MASK in off.rows and not set(SHARED) & set(off.rows)
