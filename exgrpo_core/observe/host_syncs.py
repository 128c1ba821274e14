"""Count host synchronisations: the calls that make the host wait for the device (a CPU proxy for GPU stalls).

On a GPU each of these copies a value back before Python can go on, so the CPU cannot queue the next
kernels while the GPU works: `.item()` / `float()` / `int()` / `bool()` of a tensor
(aten._local_scalar_dense, aten.is_nonzero), data-dependent shapes (nonzero, unique, masked_select,
boolean indexing, repeat_interleave without output_size) and `.tolist()` (which bypasses the
dispatcher, so it is wrapped while counting). On a CPU nothing waits, but the same calls happen, so a
count taken here tells how many waits a GPU run of the same code would have. `mark` notes where each
step begins (usable as a forward pre-hook), so counts can be read per decode step.
"""

from __future__ import annotations

import collections
import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode

SYNC_OPS = frozenset({"_local_scalar_dense", "is_nonzero", "nonzero", "nonzero_static_cpu", "equal",
                      "masked_select", "unique_dim", "_unique2", "unique_consecutive", "allclose",
                      "_assert_async"})


class HostSyncCounter(TorchDispatchMode):
    """While active: `counts[name]` tallies host-syncing calls, `total` is their sum, and `events` holds
    ("step", i) markers and the names of the syncing calls in order.

    Example: with HostSyncCounter() as c: x.sum().item()  ->  c.counts == {"_local_scalar_dense": 1}.
    """

    def __init__(self):
        super().__init__()
        self.counts: collections.Counter = collections.Counter()
        self.events: list = []
        self.steps = 0
        self._tolist = None

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def mark(self, *_args) -> None:
        """Note the start of a step."""
        self.events.append(("step", self.steps))
        self.steps += 1

    def per_step(self) -> list[list[str]]:
        """The syncing calls between one step marker and the next (those before the first dropped)."""
        out: list[list[str]] = []
        for e in self.events:
            if isinstance(e, tuple):
                out.append([])
            elif out:
                out[-1].append(e)
        return out

    def _note(self, name: str) -> None:
        self.counts[name] += 1
        self.events.append(name)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in SYNC_OPS:
            self._note(name)
        elif name == "index" and any(isinstance(t, torch.Tensor) and t.dtype == torch.bool
                                     for t in (args[1] if len(args) > 1 else []) if t is not None):
            self._note("index(bool)")  # boolean indexing: a nonzero inside
        elif name == "repeat_interleave" and (kwargs or {}).get("output_size") is None and len(args) < 3:
            self._note("repeat_interleave")
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        original, counter = torch.Tensor.tolist, self

        def tolist(t):
            counter._note("tolist")
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
