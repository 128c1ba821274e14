"""FSDP2 (`train.sharding=fsdp2`): parameters, gradients and AdamW state sharded over the processes.

Each decoder layer and then the whole model become `fully_shard` units on a 1-D mesh of all
processes (gloo on CPU, NCCL on GPU). With sharded parameters every forward pass is a collective, so
callers make every process run the same number of passes (team.py pads shares, optimise.py pads
micro-batches with zero-weight rows). Checkpoints gather the full weights and optimiser state on
rank 0 and stay ordinary Hugging Face folders; on resume every process loads them and re-shards.
"""

from __future__ import annotations

import torch
from torch import nn

from exgrpo_core import distributed as D


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The model's stack of decoder layers (the largest ModuleList), sharded one unit per layer."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) > 0]
    if not lists:
        raise ValueError(f"{type(model).__name__} has no ModuleList of decoder layers to shard with FSDP2")
    return max(lists, key=len)


def shard_model(model: nn.Module, device: torch.device, bf16: bool) -> nn.Module:
    """Apply FSDP2 in place: one unit per decoder layer, then the root (embeddings, norm, head)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if not dist.is_initialized():  # one process (e.g. one GPU): FSDP2 still needs a process group
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(),
                                rank=0, world_size=1)
    mesh = init_device_mesh(device.type, (D.topology().world,))
    policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16
              else MixedPrecisionPolicy())
    model.to(device)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """Full (unsharded, CPU) model and optimiser state dicts on rank 0; every process must call this."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=opts), get_optimizer_state_dict(model, optimizer, options=opts)


def load_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Load a full optimiser state dict (from `full_state`) into this process's shard."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))
