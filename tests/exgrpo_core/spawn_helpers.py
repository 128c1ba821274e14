"""Spawned processes on a free local port (gloo tests): `run_two(target, *args)` (or `run_procs(n, ...)`),
and `as_rank(rank, port, out, fn, *args)` for a target's body."""

from __future__ import annotations

import os
import tempfile
import time
import traceback
from pathlib import Path

import torch.multiprocessing as mp

from exgrpo_core.rollout.remote import free_port

_DONE_DIR = "EXGRPO_TEST_DONE_DIR"


def run_two(target, *args, timeout: float = 300, gpu: bool = False) -> tuple[list, list[int | None]]:
    """Start target(rank, *args, port, queue) for ranks 0 and 1; returns (what each put on the queue,
    exit codes). The children see no GPU unless `gpu`: these are gloo tests, and on a GPU machine
    Accelerate would otherwise put both on NCCL, which refuses two ranks on one GPU."""
    return run_procs(2, target, *args, timeout=timeout, gpu=gpu)


def run_procs(n: int, target, *args, timeout: float = 300, gpu: bool = False) -> tuple[list, list[int | None]]:
    """`run_two` for ranks 0 .. n-1."""
    port = free_port()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    with tempfile.TemporaryDirectory() as done:
        os.environ[_DONE_DIR] = done  # the children inherit it
        if not gpu:
            os.environ["CUDA_VISIBLE_DEVICES"] = ""
        procs = [ctx.Process(target=target, args=(r, *args, port, q)) for r in range(n)]
        try:
            for p in procs:
                p.start()
        finally:
            if hidden is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = hidden
        try:
            items = [q.get(timeout=timeout) for _ in procs]
            for p in procs:
                p.join(timeout=60)
        finally:  # a hung process fails the test instead of keeping pytest from exiting
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join()
    return items, [p.exitcode for p in procs]


def as_rank(rank: int, port: int, out, fn, *args, world: int = 2, local_world: int | None = None) -> None:
    """Run fn(rank, *args) as rank `rank` of `world` (gloo env on `port`; `local_world` processes per
    simulated machine, default all) and put (rank, its result or {"error": traceback}) on `out`. Rank 0
    hosts the process group's store, so it stays up until the others are through: a process group
    torn down after its store is gone can hang."""
    local = local_world or world
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank % local),
                      WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(local), OMP_NUM_THREADS="1")
    try:
        result = fn(rank, *args)
    except BaseException:
        result = {"error": traceback.format_exc()}
    folder = Path(os.environ[_DONE_DIR])
    if rank:
        (folder / f"rank{rank}").touch()
    else:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not all((folder / f"rank{r}").exists() for r in range(1, world)):
            time.sleep(0.05)
    out.put((rank, result))
