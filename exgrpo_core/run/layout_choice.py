"""`train.sharding=auto`, `model.gradient_checkpointing=auto` and `train.pack_sequences=auto`, resolved
once when a run starts.

On CUDA the rule of exgrpo_core/training/layout.py decides from the model's shape (its config.json),
the number of training processes and the GPU's memory; on CPU an `auto` value means replicated and no
gradient checkpointing. Packing is on where packing.py's varlen FlashAttention runs (CUDA, a bf16 or
fp16 model dtype, a torch with varlen_attn), else off (CPU keeps the padded path with prompt sharing).
Explicit values are never changed. Rank 0 decides and broadcasts the choice, so
every process builds the same layout; the config is resolved in place, so what the run records
(database, MLflow params) is what ran.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import torch

from exgrpo_core.config.schema import ExGRPOConfig
from exgrpo_core.models import load as models
from exgrpo_core.training import packing
from exgrpo_core.training.layout import GiB, train_layout
from exgrpo_core.training.memory_plan import ModelShape

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Choice:
    sharding: str  # "replicate" or "fsdp2"
    gradient_checkpointing: bool
    why: str  # one line: what it was decided from
    pack_sequences: bool = False  # train.pack_sequences


def micro_batch_tokens(cfg: ExGRPOConfig) -> int:
    """Tokens of one training micro-batch: train.micro_batch_tokens, else rows x (prompt + response)."""
    return cfg.train.micro_batch_tokens or cfg.train.micro_batch_size * (
        cfg.rollout.max_prompt_tokens + cfg.rollout.max_response_tokens)


def varlen_packs(cfg: ExGRPOConfig, gpu: bool, varlen: bool | None = None) -> tuple[bool, str]:
    """(whether packed attention runs torch's varlen FlashAttention, why): packing.packed_attention_forward
    takes it on a GPU with bf16/fp16 queries (model.dtype bfloat16 under autocast, float16 in the weights)
    and a torch that has varlen_attn (`varlen`; None: this torch); elsewhere it loops over rows."""
    if varlen is None:
        varlen = packing._varlen() is not None
    if not gpu:
        return False, "no GPU"
    if cfg.model.dtype not in ("bfloat16", "float16"):
        return False, f"model.dtype={cfg.model.dtype}: no varlen FlashAttention"
    if not varlen:
        return False, f"torch {torch.__version__} has no varlen_attn"
    return True, f"varlen FlashAttention in {cfg.model.dtype}"


def decide(cfg: ExGRPOConfig, *, gpus: int, gpu_gib: float | None,
           shape: Callable[[], ModelShape], varlen: bool | None = None) -> Choice | None:
    """The layout for the `auto` fields of `cfg` (None when none is auto); `gpu_gib` None: no GPU.
    `shape` is called only when the rule needs it (a GPU run with sharding or checkpointing auto);
    `varlen`: whether torch has varlen_attn (None: this torch's answer)."""
    auto_shard, auto_ckpt = cfg.train.sharding == "auto", cfg.model.gradient_checkpointing == "auto"
    auto_pack = cfg.train.pack_sequences == "auto"
    if not (auto_shard or auto_ckpt or auto_pack):
        return None
    sharding, ckpt, why = cfg.train.sharding, cfg.model.gradient_checkpointing, []
    if gpu_gib is None:
        sharding, ckpt, why = "replicate", False, ["no GPU"]
    elif auto_shard or auto_ckpt:
        tokens = micro_batch_tokens(cfg)
        m = shape()
        # an explicit replicate holds the whole state on each GPU: checkpointing is judged as on one GPU
        lay = train_layout(m, gpus=1 if cfg.train.sharding == "replicate" else gpus, gpu_gib=gpu_gib,
                           micro_batch_tokens=tokens)
        sharding, ckpt = lay.sharding, lay.gradient_checkpointing
        why = [f"{m.params / 1e9:.2f}B params, {gpus} GPU(s) of {gpu_gib:.0f} GiB, {tokens} tokens per "
               f"micro-batch: {lay.state_gib:.1f} GiB state, {lay.activations_gib:.1f} GiB activations per GPU"]
    pack = bool(cfg.train.pack_sequences)
    if auto_pack:
        pack, reason = varlen_packs(cfg, gpu_gib is not None, varlen)
        if gpu_gib is not None:  # "no GPU" is said once
            why.append(f"packing: {reason}" if pack else f"padded: {reason}")
    if not auto_shard:
        sharding = cfg.train.sharding
    if not auto_ckpt:
        ckpt = bool(cfg.model.gradient_checkpointing)
    return Choice(sharding, ckpt, "; ".join(why), pack)


def apply(cfg: ExGRPOConfig, choice: Choice | None) -> ExGRPOConfig:
    """Write `choice` into `cfg` in place (nothing when `choice` is None), so the caller's config, the one
    the flow logs to MLflow and the database records, holds the values that ran."""
    if choice is not None:
        cfg.train.sharding = choice.sharding
        cfg.model.gradient_checkpointing = choice.gradient_checkpointing
        cfg.train.pack_sequences = choice.pack_sequences
    return cfg


def describe(choice: Choice) -> str:
    """The one log line of a choice."""
    return (f"layout (auto): train.sharding={choice.sharding} "
            f"model.gradient_checkpointing={str(choice.gradient_checkpointing).lower()} "
            f"train.pack_sequences={str(choice.pack_sequences).lower()} ({choice.why})")


def choose_here(cfg: ExGRPOConfig, device: torch.device, gpus: int) -> Choice | None:
    """`decide` on this machine: the GPU memory of `device` when it is CUDA, the model's own config.json."""
    gpu_gib = None
    if torch.device(device).type == "cuda":
        gpu_gib = torch.cuda.get_device_properties(device).total_memory / GiB

    def shape() -> ModelShape:
        return ModelShape.from_hf_config(models.policy_config(
            cfg.model.name_or_path, tiny=cfg.model.tiny.model_dump(), hf_overrides=cfg.model.hf_overrides))

    choice = decide(cfg, gpus=gpus, gpu_gib=gpu_gib, shape=shape)
    if choice is not None:  # on a GPU where users read it; on CPU (always replicated) only in the log
        (print if gpu_gib is not None else log.info)(describe(choice))
    return choice
