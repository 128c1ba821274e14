"""FSDP2 (`train.sharding=fsdp2`): parameters, gradients and AdamW state sharded over the processes.

Each decoder layer and then the whole model become `fully_shard` units on a 1-D mesh of all
processes (gloo on CPU, NCCL on GPU), or with HSDP (`train.hsdp`, `mesh_shape`) on a 2-D mesh
(replicate x shard): each group of `shard` processes (one machine) holds one sharded copy, so the
layers' all-gathers and reduce-scatters stay inside a machine and only the gradient all-reduce
crosses machines. With sharded parameters every forward pass is a collective, so
callers make every process run the same number of passes (team.py pads shares, optimise.py pads
micro-batches with zero-weight rows). Checkpoints gather the full weights on rank 0 (an ordinary
Hugging Face folder) or, with run.checkpoint_weights=sharded, each process writes its weight shard;
each process always writes its own optimiser shard (torch.distributed.checkpoint). At start-up and on
resume the model is built on the meta device and sharded first; then rank 0 alone reads a Hugging Face
folder and broadcasts it tensor by tensor (`load_full_state`), or each process reads its part of the
weight shards (`load_model_shards`), so no process but rank 0 ever holds the whole model.
"""

from __future__ import annotations

import os
from typing import Iterator

import torch
from torch import nn

from exgrpo_core.training import distributed as D

MESH_DIMS = ("replicate", "shard")


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The model's stack of decoder layers (the largest ModuleList), sharded one unit per layer."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) > 0]
    if not lists:
        raise ValueError(f"{type(model).__name__} has no ModuleList of decoder layers to shard with FSDP2")
    return max(lists, key=len)


def local_world_size(world: int) -> int:
    """Processes on this machine: LOCAL_WORLD_SIZE (set by torchrun and accelerate launch), else `world`."""
    value = os.environ.get("LOCAL_WORLD_SIZE", "")
    return int(value) if value.isdigit() and int(value) > 0 else world


def mesh_shape(hsdp: str, world: int, local_world: int, shard_size: int | None = None) -> tuple[int, ...]:
    """The FSDP2 mesh for `train.hsdp` / `train.shard_size`: (world,) or (replicate, shard) for HSDP.
    auto: HSDP when the shard group (shard_size, else the processes per machine) is smaller than the
    world, i.e. the processes span several machines; on: always (1 x world on one machine); off: never."""
    if hsdp not in ("auto", "on", "off"):
        raise ValueError(f"train.hsdp must be auto, on or off (got {hsdp!r})")
    if hsdp == "off":
        return (world,)
    size = shard_size or local_world
    if hsdp == "auto" and size >= world:
        return (world,)
    if world % size:
        raise ValueError(f"train.hsdp={hsdp}: {world} processes are not a multiple of the shard group of {size} "
                         f"({'train.shard_size' if shard_size else 'processes per machine, LOCAL_WORLD_SIZE'})")
    return (world // size, size)


def shard_model(model: nn.Module, device: torch.device, bf16: bool, cpu_offload: bool = False,
                shape: tuple[int, ...] | None = None) -> nn.Module:
    """Apply FSDP2 in place: one unit per decoder layer, then the root (embeddings, norm, head).
    `cpu_offload`: the shards (and so their gradients and optimiser state) live in CPU memory and are
    copied to `device` for each unit's forward and backward. `shape`: the mesh (`mesh_shape`); None or
    one dimension shards over all processes, (replicate, shard) is HSDP."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    if not dist.is_initialized():  # one process (e.g. one GPU): FSDP2 still needs a process group
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(),
                                rank=0, world_size=1)
    world = D.topology().world
    shape = tuple(shape) if shape else (world,)
    if len(shape) not in (1, 2) or shape[0] * (shape[1] if len(shape) == 2 else 1) != world:
        raise ValueError(f"FSDP2 mesh {shape} does not cover the {world} processes")
    mesh = (init_device_mesh(device.type, shape, mesh_dim_names=MESH_DIMS) if len(shape) == 2
            else init_device_mesh(device.type, shape))
    policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16
              else MixedPrecisionPolicy())
    offload = CPUOffloadPolicy(pin_memory=device.type == "cuda") if cpu_offload else OffloadPolicy()
    empty = any(p.is_meta for p in model.parameters())
    if not cpu_offload and not empty:
        model.to(device)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=policy, offload_policy=offload)
    fully_shard(model, mesh=mesh, mp_policy=policy, offload_policy=offload)
    if empty:  # built on the meta device: allocate this process's shards only (weights load next)
        _materialise(model, torch.device("cpu") if cpu_offload else device)
    model.exgrpo_compute_device = device  # with offload the parameters' device is not where inputs go
    return model


def _materialise(model: nn.Module, device: torch.device) -> None:
    """Allocate (uninitialised) the shards of a model sharded on the meta device, keeping its real buffers
    (rotary frequencies and the like, computed from the config; not in the state dict)."""
    kept = {name: b for name, b in model.named_buffers() if not b.is_meta}
    model.to_empty(device=device)  # FSDPModule._apply re-registers each sharded parameter
    for name, b in kept.items():
        owner, _, attr = name.rpartition(".")
        model.get_submodule(owner)._buffers[attr] = b.to(device if device.type != "cpu" else b.device)


def load_full_state(model: nn.Module, state: dict | None) -> None:
    """Fill a sharded model from the full state dict held by rank 0 alone (`state`, None elsewhere):
    rank 0 broadcasts one tensor at a time and each process keeps its shard, so no other process ever
    holds the whole model (torch's set_model_state_dict with broadcast_from_rank0); every process calls."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, state if state is not None else {},
                         options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))


def load_model_shards(model: nn.Module, folder: str) -> None:
    """Read a checkpoint's weight shards (`save_model_shards`) straight into a sharded model: each process
    reads the parts of the files that make up its own shard (dcp.load into the sharded state dict)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    state = get_model_state_dict(model)
    dcp.load(state, checkpoint_id=folder)
    set_model_state_dict(model, state)


def unsharded_grad_bytes(model: nn.Module) -> int:
    """Bytes of whole (unsharded) gradients FSDP2 holds between backward passes: kept when gradient sync
    is off for a micro-batch (the unsharded parameter's `.grad`, or `unsharded_accumulated_grad` upcast to
    the reduce dtype); 0 when every backward reduce-scatters into the shards."""
    from torch.distributed.fsdp import FSDPModule

    total = 0
    for module in model.modules():
        if isinstance(module, FSDPModule):
            state = module._get_fsdp_state()
            groups = getattr(state, "_fsdp_param_groups", None)  # (torch < 2.12: one `_fsdp_param_group` or None)
            if groups is None:
                groups = [g for g in [getattr(state, "_fsdp_param_group", None)] if g is not None]
            for group in groups:
                for fp in group.fsdp_params:
                    whole = getattr(fp, "_unsharded_param", None)
                    for grad in (getattr(fp, "unsharded_accumulated_grad", None), getattr(whole, "grad", None)):
                        total += grad.numel() * grad.element_size() if grad is not None else 0
    return total


def compute_device(model: nn.Module) -> torch.device:
    """Where the model's inputs go: its parameters' device, or the device FSDP2 copies offloaded shards to."""
    device = getattr(model, "exgrpo_compute_device", None)
    return device if device is not None else next(model.parameters()).device


def is_sharded(model: nn.Module) -> bool:
    """Whether `model` is an FSDP2 module (`shard_model` was applied)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def full_model_state(model: nn.Module) -> dict:
    """The full (unsharded, CPU) model state dict on rank 0; every process must call this."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def full_parameters(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Each named parameter as one whole tensor, one at a time (FSDP2: all-gathered on every process,
    so every process must walk the whole iterator; memory stays one tensor, not the model)."""
    for name, p in model.named_parameters():
        t = p.detach()
        yield name, t.full_tensor() if hasattr(t, "full_tensor") else t


_BACKGROUND: dict = {"on": False, "groups": {}, "writes": []}


def background_writes(on: bool) -> None:
    """`run.async_checkpoint`: the shard writes below copy the state to CPU memory and return, writing the
    files in a background thread (dcp.async_save); `wait_writes` waits for them. Set alike on every process."""
    _BACKGROUND["on"] = bool(on)


def _write(state: dict, folder: str, kind: str) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    if not _BACKGROUND["on"]:
        dcp.save(state, checkpoint_id=folder)
        return
    groups = _BACKGROUND["groups"]
    if kind not in groups:  # a gloo group per kind of write: two writes' threads (weights, optimiser) run
        groups[kind] = dist.new_group(backend="gloo")  # at once, and neither meets training's collectives
        D.before_shutdown(wait_writes)  # a follower's thread ends before its process group does
    writes = _BACKGROUND["writes"]
    for _, future in [w for w in writes if w[0] == kind]:  # the last checkpoint's (finished on rank 0)
        future.result()
    writes[:] = [w for w in writes if w[0] != kind]
    writes.append((kind, dcp.async_save(state, checkpoint_id=folder, process_group=groups[kind])))


def wait_writes() -> None:
    """Wait for this process's background shard writes; raises the first one's error. On rank 0 its
    writes' end means every process's files are written (dcp's finish gathers every rank's results)."""
    writes, _BACKGROUND["writes"] = _BACKGROUND["writes"], []
    for _, future in writes:
        future.result()


def save_model_shards(model: nn.Module, folder: str) -> None:
    """Each process writes its own weight shard into `folder` (every process must call this; in the
    background with `background_writes`)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    _write(get_model_state_dict(model), folder, "model")


def save_optimizer_shards(model: nn.Module, optimizer: torch.optim.Optimizer, folder: str) -> None:
    """Each process writes its optimiser shard into `folder` (every process must call this; in the
    background with `background_writes`)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    _write({"optimizer": get_optimizer_state_dict(model, optimizer)}, folder, "optimizer")


def load_optimizer_shards(model: nn.Module, optimizer: torch.optim.Optimizer, folder: str) -> None:
    """Read this process's optimiser shard from `folder` (every process must call this)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    state = {"optimizer": get_optimizer_state_dict(model, optimizer)}  # the layout to fill, states initialised
    dcp.load(state, checkpoint_id=folder)
    set_optimizer_state_dict(model, optimizer, state["optimizer"])


def load_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Load a full optimiser state dict (a checkpoint written without sharding) into this process's shard."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    names = [n for n, _ in model.named_parameters()]  # torch's own state dict keys parameters by index
    if any(isinstance(k, int) for k in state.get("state", {})) or any(
            isinstance(p, int) for g in state.get("param_groups", []) for p in g["params"]):
        state = {"state": {names[k]: v for k, v in state["state"].items()},
                 "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]}
    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))
