"""Count the operations that make the host wait for the device (a CPU proxy for GPU stalls).

On a GPU each of these copies a value back to the host before Python can go on, so the CPU cannot
queue the next kernels while the GPU works: `.item()` / `float()` / `int()` / `bool()` on a tensor
(aten._local_scalar_dense, aten.is_nonzero), data-dependent shapes (nonzero, unique, masked_select,
boolean indexing), and `.tolist()` (which bypasses the dispatcher, so it is wrapped while counting).
On a CPU nothing waits, but the same calls happen, so a count taken on a CPU tells how many waits a
GPU run of the same code would have.
"""

from __future__ import annotations

import collections
import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_SYNCING = {"_local_scalar_dense", "is_nonzero", "nonzero", "_unique2", "unique_dim", "unique_consecutive",
            "masked_select", "equal"}


class HostSyncCounter(TorchDispatchMode):
    """While active, `counts[name]` tallies host-synchronising calls; `total` is their sum.

    Example: with HostSyncCounter() as c: x.sum().item()  ->  c.counts == {"_local_scalar_dense": 1}.
    """

    def __init__(self):
        super().__init__()
        self.counts: collections.Counter = collections.Counter()
        self._tolist = None

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name.split("::")[-1]
        if name in _SYNCING:
            self.counts[name] += 1
        elif name == "index" and any(isinstance(t, torch.Tensor) and t.dtype == torch.bool
                                     for t in (args[1] if len(args) > 1 else []) if t is not None):
            self.counts["index(bool)"] += 1  # boolean indexing: a nonzero inside
        elif name == "repeat_interleave" and (kwargs or {}).get("output_size") is None and len(args) < 3:
            self.counts["repeat_interleave"] += 1
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        original = torch.Tensor.tolist
        counter = self

        def tolist(t):
            counter.counts["tolist"] += 1
            return original(t)

        self._tolist = original
        torch.Tensor.tolist = tolist
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist = self._tolist
        return super().__exit__(*exc)


@contextlib.contextmanager
def counting():
    """`with counting() as c:` a HostSyncCounter."""
    with HostSyncCounter() as c:
        yield c
