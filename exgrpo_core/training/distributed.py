"""Several processes (`accelerate launch --num_processes N`): the main process decides, every process computes.

Rank 0 owns the experience database, MLflow and Prefect; the others hold the same model and follow
its decisions through torch.distributed (gloo on CPU, NCCL on GPU). What moves between processes
is plain records (questions to sample, rollouts), pickled by the object collectives, and tensors (a
training batch), sent as raw bytes beside them (`broadcast`).
With one process (or no process group) every helper is a no-op, so single-process code is unchanged.

The device rule: a collective runs on a device its group serves. Accelerate starts NCCL, which serves
CUDA tensors only, so host values (numbers, keys, pickled records) go through a gloo side group
(`host_group`), and bulk tensors through the default group on the GPU when it serves one, else the
side group on the host (`group_for`). tests/exgrpo_core/training/test_collective_devices.py runs
every helper under a default group that serves no CPU tensor.
"""

from __future__ import annotations

import io
import math
import pickle
import time
from dataclasses import dataclass
from typing import Any, Sequence, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


@dataclass(frozen=True)
class Topology:
    rank: int
    world: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def topology() -> Topology:
    """This process's rank and the world size (0 / 1 without a process group)."""
    if dist.is_available() and dist.is_initialized():
        return Topology(dist.get_rank(), dist.get_world_size())
    return Topology(0, 1)


def served_devices(group=None) -> set[str]:
    """Device types the group's backends take tensors of ("cuda:nccl" -> {"cuda"}; a plain "gloo"
    serves both kinds)."""
    parts = dist.get_backend_config(group).split(",")
    return {p.split(":")[0].strip() for p in parts if ":" in p} or {"cpu", "cuda"}


_HOST_GROUP: list = []  # [group] once made; None inside when the default group serves host tensors


def host_group():
    """The group host values travel through: the default group when it serves CPU tensors (gloo), else
    a gloo side group over every rank. Made once; every process must call it in the same order as its
    other `new_group` calls, so sessions call it right after joining the process group."""
    if not _HOST_GROUP:
        _HOST_GROUP.append(None if "cpu" in served_devices() else dist.new_group(backend="gloo"))
    return _HOST_GROUP[0]


def bulk_device() -> torch.device:
    """Where bulk tensors (a training batch, gradients) cross: the GPU when the default group serves
    CUDA and one is present, else the host."""
    if "cuda" in served_devices() and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def group_for(device: torch.device):
    """The group that serves tensors on `device`: the default group when it does, else (host tensors)
    the gloo side group."""
    return None if device.type in served_devices() else host_group()


BROADCAST_BYTES = {"calls": 0, "pickled": 0, "tensors": 0}
"""What `broadcast` has sent from this process's view, cumulative: the pickled part and the tensors' bytes."""
_ALIGN = 16


class _TensorPickler(pickle.Pickler):
    """Pickles everything but plain dense tensors, which it lists (sent as raw bytes, not pickled)."""

    def __init__(self, file, tensors: list):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.tensors = tensors

    def persistent_id(self, obj):
        if type(obj) is torch.Tensor and obj.layout == torch.strided and not obj.requires_grad:
            self.tensors.append(obj)
            return len(self.tensors) - 1
        return None


class _TensorUnpickler(pickle.Unpickler):
    def __init__(self, file, tensors: list):
        super().__init__(file)
        self.tensors = tensors

    def persistent_load(self, pid):
        return self.tensors[pid]


def _offsets(specs) -> tuple[list[int], int]:
    """Byte offset of each tensor in the one flat buffer (each aligned), and the buffer's size."""
    offsets, size = [], 0
    for shape, dtype, _ in specs:
        offsets.append(size)
        size += -(-math.prod(shape) * dtype.itemsize // _ALIGN) * _ALIGN
    return offsets, size


def broadcast(obj: T | None, src: int = 0) -> T:
    """`obj` from rank `src` on every rank. Plain tensors inside it (a training batch's token ids,
    masks, advantages) travel as one flat byte buffer through `dist.broadcast` (on the GPU under NCCL);
    only the rest is pickled (broadcast_object_list). Counted in BROADCAST_BYTES."""
    if topology().world == 1:
        return obj  # type: ignore[return-value]
    tensors: list[torch.Tensor] = []
    head = None
    if topology().rank == src:
        buf = io.BytesIO()
        _TensorPickler(buf, tensors).dump(obj)
        head = (buf.getvalue(), [(tuple(t.shape), t.dtype, t.device.type) for t in tensors])
    box = [head]
    dist.broadcast_object_list(box, src=src, group=host_group())
    payload, specs = box[0]
    BROADCAST_BYTES["calls"] += 1
    BROADCAST_BYTES["pickled"] += len(payload)
    if not specs:
        return obj if topology().rank == src else pickle.loads(payload)
    offsets, size = _offsets(specs)
    device = bulk_device()
    flat = torch.empty(size, dtype=torch.uint8, device=device)
    if topology().rank == src:
        for t, start in zip(tensors, offsets):
            flat[start:start + t.numel() * t.element_size()].copy_(t.detach().contiguous().reshape(-1).view(torch.uint8))
    dist.broadcast(flat, src=src, group=group_for(device))
    BROADCAST_BYTES["tensors"] += sum(math.prod(shape) * dtype.itemsize for shape, dtype, _ in specs)
    if topology().rank == src:
        return obj  # type: ignore[return-value]
    got = [flat[start:start + math.prod(shape) * dtype.itemsize].view(dtype).reshape(shape).to(kind)
           for (shape, dtype, kind), start in zip(specs, offsets)]
    return _TensorUnpickler(io.BytesIO(payload), got).load()


def gather_lists(part: list[T]) -> list[T] | None:
    """Concatenate every rank's list, in rank order, on rank 0 (None on the others)."""
    topo = topology()
    if topo.world == 1:
        return list(part)
    out: list[Any] | None = [None] * topo.world if topo.is_main else None
    dist.gather_object(part, out, dst=0, group=host_group())
    return [x for p in out for x in p] if out is not None else None


def shard(items: Sequence[T], rank: int, world: int) -> list[T]:
    """Contiguous share of `items` for `rank`: sizes differ by at most one, concatenation restores order."""
    base, extra = divmod(len(items), world)
    start = rank * base + min(rank, extra)
    return list(items[start:start + base + (1 if rank < extra else 0)])


def grad_buckets(params, bucket_bytes: int = 25 << 20) -> list[list[torch.Tensor]]:
    """The trainable parameters in order, cut into buckets of one dtype and device and at most
    `bucket_bytes` (one parameter larger than that is a bucket of its own), as DDP buckets them."""
    buckets: list[list[torch.Tensor]] = []
    size = 0
    for p in params:
        if not p.requires_grad:
            continue
        nbytes = p.numel() * p.element_size()
        last = buckets[-1] if buckets else None
        if last is None or size + nbytes > bucket_bytes or (last[0].dtype, last[0].device) != (p.dtype, p.device):
            buckets.append([])
            size = 0
        buckets[-1].append(p)
        size += nbytes
    return buckets


def all_reduce_grads(params, bucket_bytes: int = 25 << 20) -> int:
    """Sum gradients over processes (a missing gradient counts as zeros), one all-reduce per bucket of
    `grad_buckets`; returns the number of collectives."""
    if topology().world == 1:
        return 0
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    buckets = grad_buckets(params, bucket_bytes)
    for bucket in buckets:
        for p in bucket:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = _flatten_dense_tensors([p.grad for p in bucket])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group_for(flat.device))
        for p, summed in zip(bucket, _unflatten_dense_tensors(flat, [p.grad for p in bucket])):
            p.grad.copy_(summed)
    return len(buckets)


def all_reduce_sums(values: dict[str, float], keys: Sequence[str]) -> dict[str, float]:
    """Sum the numbers under `keys` over processes (missing keys count as 0); other keys unchanged."""
    if topology().world == 1:
        return dict(values)
    t = torch.tensor([float(values.get(k, 0.0)) for k in keys], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=host_group())
    return {**values, **{k: float(v) for k, v in zip(keys, t.tolist())}}


def all_reduce_max(value: float) -> float:
    """The largest `value` over processes."""
    if topology().world == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=host_group())
    return float(t.item())


def all_keys(keys: Sequence[str]) -> list[str]:
    """The sorted union of every process's keys (so reductions line up when a process saw none)."""
    if topology().world == 1:
        return sorted(set(keys))
    parts: list[Any] = [None] * topology().world
    dist.all_gather_object(parts, list(keys), group=host_group())
    return sorted({k for p in parts for k in p})


def barrier() -> None:
    """Wait for every process (a no-op with one)."""
    if topology().world > 1:
        dist.barrier(group=host_group())


_BEFORE_SHUTDOWN: list = []


def before_shutdown(fn) -> None:
    """Run `fn()` at the start of `shutdown` (once per registration), e.g. to wait for background writes."""
    if fn not in _BEFORE_SHUTDOWN:
        _BEFORE_SHUTDOWN.append(fn)


def shutdown() -> None:
    """Leave the process group together (barrier, then destroy): a process that exits with the group
    still alive can abort in gloo's teardown ("terminate called without an active exception").

    The pause after the barrier lets gloo's worker threads free the finished operations, which needs
    the GIL: if the group is freed first (e.g. with a DDP model), its destructor holds the GIL while it
    joins those threads, and the process hangs for good (torch issue 56297)."""
    for fn in _BEFORE_SHUTDOWN:
        fn()
    if topology().world > 1:
        dist.barrier(group=host_group())
        time.sleep(0.2)
        dist.destroy_process_group()
    _HOST_GROUP.clear()
