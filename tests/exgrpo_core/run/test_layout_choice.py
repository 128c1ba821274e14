"""`train.sharding=auto` / `model.gradient_checkpointing=auto` resolved at start (run/layout_choice.py)."""

import importlib.util
from pathlib import Path

import pytest
import torch

from exgrpo_core.config.load import load_config
from exgrpo_core.run import layout_choice as L
from exgrpo_core.training.memory_plan import QWEN25_MATH_7B, ModelShape

QWEN25_05B = ModelShape(layers=24, hidden=896, intermediate=4864, heads=14, kv_heads=2, vocab=151936,
                        tied_embeddings=True)
TOKENS = ["train.micro_batch_tokens=32768"]


def _never():
    raise AssertionError("the model's shape is not needed here")


def test_auto_is_the_default_and_explicit_values_still_parse():
    cfg = load_config("tiny")
    assert (cfg.train.sharding, cfg.model.gradient_checkpointing) == ("auto", "auto")
    cfg = load_config("tiny", ["train.sharding=fsdp2", "model.gradient_checkpointing=true"])
    assert (cfg.train.sharding, cfg.model.gradient_checkpointing) == ("fsdp2", True)
    paper = load_config("paper")  # the presets that set the layout keep it
    assert (paper.train.sharding, paper.model.gradient_checkpointing) == ("fsdp2", True)


def test_one_gpu_and_a_05b_model_is_replicated_without_checkpointing():
    got = L.decide(load_config("tiny", TOKENS), gpus=1, gpu_gib=80, shape=lambda: QWEN25_05B)
    assert (got.sharding, got.gradient_checkpointing) == ("replicate", False)
    assert "1 GPU(s) of 80 GiB" in L.describe(got) and "train.sharding=replicate" in L.describe(got)


def test_eight_gpus_and_the_7b_model_is_fsdp2_with_checkpointing():
    got = L.decide(load_config("tiny", TOKENS), gpus=8, gpu_gib=80, shape=lambda: QWEN25_MATH_7B)
    assert (got.sharding, got.gradient_checkpointing) == ("fsdp2", True)


def test_explicit_values_are_untouched():
    both = load_config("tiny", [*TOKENS, "train.sharding=fsdp2", "model.gradient_checkpointing=true",
                                "train.pack_sequences=false"])
    assert L.decide(both, gpus=1, gpu_gib=80, shape=_never) is None
    assert L.apply(both, None) is both and both.train.sharding == "fsdp2" and both.model.gradient_checkpointing
    one = load_config("tiny", [*TOKENS, "model.gradient_checkpointing=false"])  # only sharding auto
    got = L.decide(one, gpus=8, gpu_gib=80, shape=lambda: QWEN25_MATH_7B)
    assert (got.sharding, got.gradient_checkpointing) == ("fsdp2", False)
    one = load_config("tiny", [*TOKENS, "train.sharding=replicate"])  # judged on the whole state per GPU
    got = L.decide(one, gpus=8, gpu_gib=80, shape=lambda: QWEN25_05B)
    assert (got.sharding, got.gradient_checkpointing) == ("replicate", False)


def test_cpu_is_replicated_without_checkpointing_and_resolved_in_place():
    cfg = load_config("tiny")
    got = L.choose_here(cfg, torch.device("cpu"), 4)
    assert (got.sharding, got.gradient_checkpointing) == ("replicate", False)
    assert L.decide(cfg, gpus=4, gpu_gib=None, shape=_never) == got
    assert L.apply(cfg, got) is cfg
    assert (cfg.train.sharding, cfg.model.gradient_checkpointing) == ("replicate", False)


def test_the_memory_plan_script_resolves_auto_as_the_run_would():
    path = Path(__file__).resolve().parents[3] / "scripts" / "memory_plan.py"
    spec = importlib.util.spec_from_file_location("memory_plan_script", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    cfg = load_config("tiny", TOKENS)
    assert script.shard_group(cfg, 8, 8, QWEN25_MATH_7B, 80.0) == 8
    assert script.shard_group(cfg, 8, 8, QWEN25_05B, 80.0) == 1
    with pytest.raises(ValueError):
        L.decide(cfg, gpus=0, gpu_gib=80, shape=lambda: QWEN25_05B)


def test_open_worker_resolves_auto_in_place_before_the_model_is_built(tmp_path):
    from exgrpo_core.run.session import make_accelerator, open_worker

    cfg = load_config("tiny", [f"run.output_dir={tmp_path}", "loss.kl_coef=0"])
    assert (cfg.train.sharding, cfg.model.gradient_checkpointing) == ("auto", "auto")
    worker, _ = open_worker(cfg, make_accelerator(cfg), None, tmp_path / "run")
    assert (cfg.train.sharding, cfg.model.gradient_checkpointing) == ("replicate", False)  # what MLflow logs
    assert cfg.train.pack_sequences is False  # CPU: the padded path, as before "auto"
    model = worker.accelerator.unwrap_model(worker.model)
    on = getattr(model, "is_activation_checkpointing", None)  # transformers 5's name
    assert not worker.sharded and not (model.is_gradient_checkpointing if on is None else on)  # "auto" is not True
