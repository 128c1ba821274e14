"""Task calls whose arguments Prefect passes whole.

Before each task run Prefect visits every argument twice, element by element (to resolve futures and
states, and to record upstream task runs). Our tasks take the flow's live objects (the Session with
every question and its prompt-token cache, rollouts, evaluation reports), never futures, so each call
walked the dataset: half of an arith-fast iteration (benchmarks/speed/orchestration_overhead.py), and it
grows with the dataset. Prefect's `opaque` passes a value without walking into it; a task's own result
passed on whole still links the two task runs."""

from __future__ import annotations

from typing import Any, Callable

from prefect.utilities.annotations import opaque


def whole(task) -> Callable[..., Any]:
    """`task` as a callable that wraps each argument in `opaque` (no walk into it)."""
    def call(*args, **kwargs):
        return task(*(opaque(a) for a in args), **{k: opaque(v) for k, v in kwargs.items()})

    return call
