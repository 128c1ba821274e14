"""Count host synchronisations: operators whose result the CPU must wait for on a GPU.

`HostSyncCounter` is a `TorchDispatchMode` that records every such operator (a Python bool / int / float
of a tensor, `nonzero`, `masked_select`, ...) and, through `mark`, where each decode step begins, so a
test or benchmark on the CPU can count what would stall the host on a GPU, step by step. A device-to-host
copy (`.cpu()`, `.tolist()`) of a CPU tensor reaches no operator and is not seen: the decoders pair
each of theirs with a `nonzero`, which is.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

SYNC_OPS = frozenset({"_local_scalar_dense", "item", "is_nonzero", "nonzero", "nonzero_static_cpu", "equal",
                      "masked_select", "unique_dim", "_unique2", "unique_consecutive", "repeat_interleave",
                      "allclose", "_assert_async"})


class HostSyncCounter(TorchDispatchMode):
    """`events`: ("step", i) markers and the names of host-syncing operators, in order."""

    def __init__(self):
        super().__init__()
        self.events: list = []
        self.steps = 0

    def mark(self, *_args) -> None:
        """Note the start of a step (usable as a forward pre-hook)."""
        self.events.append(("step", self.steps))
        self.steps += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in SYNC_OPS:
            self.events.append(name)
        return func(*args, **(kwargs or {}))

    def per_step(self) -> list[list[str]]:
        """The syncing operators between one step marker and the next (those before the first dropped)."""
        out: list[list[str]] = []
        for e in self.events:
            if isinstance(e, tuple):
                out.append([])
            elif out:
                out[-1].append(e)
        return out
