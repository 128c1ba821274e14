"""The default training layout by model size and GPU count: replicated or FSDP2, gradient checkpointing
or not (issue 32 item 3; docs/scaling.md "Training layout by model size").

The rule, per GPU of `gpu_gib` GiB:
- one GPU: replicate (FSDP2 over one process shards nothing and re-gathers every layer each pass);
- several GPUs: replicate while the whole training state (16 bytes per parameter: float32 weights and
  gradients, AdamW's two moments) takes at most 40% of a GPU, else FSDP2;
- gradient checkpointing only when the state on a GPU plus one micro-batch's activations kept for the
  backward (`activation_bytes`) and its logits would pass 90% of the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from exgrpo_core.training.memory_plan import ModelShape

GiB = 2**30


@dataclass(frozen=True)
class Layout:
    sharding: str  # "replicate" or "fsdp2" (train.sharding)
    gradient_checkpointing: bool  # model.gradient_checkpointing
    state_gib: float  # weights, gradients and AdamW moments per GPU
    activations_gib: float  # one micro-batch's activations and logits without checkpointing


def activation_bytes(m: ModelShape, tokens: int) -> float:
    """Activations a bf16 forward keeps for its backward without checkpointing: per token and layer
    16h + 6i bytes (Korthikanti et al. 2022's 34h per layer with FlashAttention, the MLP terms written for
    a SwiGLU of width i), plus the scored positions' logits in bf16 and their gradient (4 V bytes)."""
    return tokens * (m.layers * (16 * m.hidden + 6 * m.intermediate) + 4 * m.vocab)


def train_layout(m: ModelShape, *, gpus: int, gpu_gib: float = 80.0, micro_batch_tokens: int = 32768) -> Layout:
    """The rule of this module's docstring for a model of shape `m` on `gpus` GPUs."""
    if gpus < 1 or gpu_gib <= 0 or micro_batch_tokens < 1:
        raise ValueError(f"gpus, gpu_gib and micro_batch_tokens must be positive, got {gpus}, {gpu_gib}, "
                         f"{micro_batch_tokens}")
    whole = 16 * m.params / GiB
    sharding = "replicate" if gpus == 1 or whole <= 0.4 * gpu_gib else "fsdp2"
    state = whole if sharding == "replicate" else whole / gpus
    act = activation_bytes(m, micro_batch_tokens) / GiB
    return Layout(sharding, state + act > 0.9 * gpu_gib, state, act)
