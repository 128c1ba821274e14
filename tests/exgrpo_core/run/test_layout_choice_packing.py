"""`train.pack_sequences=auto` resolved at start (run/layout_choice.py): packed where packing.py's varlen
FlashAttention runs (CUDA, bf16/fp16), padded elsewhere; explicit values kept."""

from types import SimpleNamespace

import pydantic
import pytest
import torch

from exgrpo_core.config.load import ConfigError, load_config
from exgrpo_core.run import layout_choice as L
from exgrpo_core.training.memory_plan import QWEN25_MATH_7B

EXPLICIT_LAYOUT = ["train.sharding=replicate", "model.gradient_checkpointing=false"]


def _never():
    raise AssertionError("the model's shape is not needed here")


def _gpu(cfg, varlen=True):
    return L.decide(cfg, gpus=1, gpu_gib=80, shape=_never, varlen=varlen)


def test_auto_is_the_default_and_every_value_parses():
    assert load_config("tiny").train.pack_sequences == "auto"
    for value, want in (("true", True), ("false", False), ("auto", "auto")):
        assert load_config("tiny", [f"train.pack_sequences={value}"]).train.pack_sequences == want
    with pytest.raises((ConfigError, pydantic.ValidationError)):
        load_config("tiny", ["train.pack_sequences=sometimes"])


@pytest.mark.parametrize("dtype,varlen,want", [
    ("bfloat16", True, True), ("float16", True, True),   # varlen FlashAttention
    ("float32", True, False),                            # packing.py would loop over rows
    ("bfloat16", False, False),                          # a torch without varlen_attn
])
def test_a_gpu_packs_where_varlen_attention_runs(dtype, varlen, want):
    got = _gpu(load_config("tiny", [*EXPLICIT_LAYOUT, f"model.dtype={dtype}"]), varlen)
    assert got.pack_sequences is want
    assert (got.sharding, got.gradient_checkpointing) == ("replicate", False)  # explicit: kept
    assert f"train.pack_sequences={str(want).lower()}" in L.describe(got)
    assert ("packing: varlen FlashAttention" in got.why) is want


def test_cpu_stays_padded_and_explicit_values_are_kept():
    cpu = L.decide(load_config("tiny", ["model.dtype=bfloat16"]), gpus=1, gpu_gib=None, shape=_never, varlen=True)
    assert cpu.pack_sequences is False and "train.pack_sequences=false" in L.describe(cpu)
    on = load_config("tiny", ["train.pack_sequences=true"])
    assert L.decide(on, gpus=1, gpu_gib=None, shape=_never).pack_sequences is True
    off = load_config("tiny", [*EXPLICIT_LAYOUT, "model.dtype=bfloat16", "train.pack_sequences=false"])
    assert _gpu(off) is None  # nothing auto: nothing to decide
    half = load_config("tiny", ["model.gradient_checkpointing=false", "model.dtype=bfloat16",
                                "train.pack_sequences=false"])
    assert L.decide(half, gpus=8, gpu_gib=80, shape=lambda: QWEN25_MATH_7B, varlen=True).pack_sequences is False


def test_apply_writes_a_bool_in_place():
    cfg = load_config("tiny", [*EXPLICIT_LAYOUT, "model.dtype=bfloat16"])
    L.apply(cfg, _gpu(cfg))
    assert cfg.train.pack_sequences is True
    cfg = load_config("tiny")
    L.apply(cfg, L.decide(cfg, gpus=2, gpu_gib=None, shape=_never))
    assert cfg.train.pack_sequences is False


def test_the_paper_preset_packs_on_gpus_and_not_on_cpu():
    paper = load_config("paper")
    assert paper.train.pack_sequences == "auto"
    got = L.decide(paper, gpus=8, gpu_gib=80, shape=lambda: QWEN25_MATH_7B, varlen=True)
    assert (got.sharding, got.gradient_checkpointing, got.pack_sequences) == ("fsdp2", True, True)
    assert L.apply(paper, got).train.pack_sequences is True
    cpu = L.decide(load_config("paper"), gpus=8, gpu_gib=None, shape=_never, varlen=True)
    assert cpu.pack_sequences is False


def test_choose_here_on_a_simulated_gpu_prints_the_packing(monkeypatch, capsys):
    monkeypatch.setattr(L.torch.cuda, "get_device_properties", lambda _d: SimpleNamespace(total_memory=80 * L.GiB))
    monkeypatch.setattr(L.packing, "_varlen", lambda: object())  # a torch that has varlen_attn
    cfg = load_config("tiny", ["model.dtype=bfloat16"])
    got = L.choose_here(cfg, torch.device("cuda"), 1)
    assert got.pack_sequences is True
    line = capsys.readouterr().out.strip()
    assert line.startswith("layout (auto):") and "train.pack_sequences=true" in line and "\n" not in line
    monkeypatch.setattr(L.packing, "_varlen", lambda: None)
    assert L.choose_here(cfg, torch.device("cuda"), 1).pack_sequences is False
