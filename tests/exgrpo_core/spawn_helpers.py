"""Two spawned processes on a free local port (gloo tests): `run_two(target, *args)`."""

from __future__ import annotations

import socket

import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two(target, *args, timeout: float = 300) -> tuple[list, list[int | None]]:
    """Start target(rank, *args, port, queue) for ranks 0 and 1; returns (what each put on the queue,
    exit codes)."""
    port = free_port()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, *args, port, q)) for r in range(2)]
    for p in procs:
        p.start()
    items = [q.get(timeout=timeout) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    return items, [p.exitcode for p in procs]
