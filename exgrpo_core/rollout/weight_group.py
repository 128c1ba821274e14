"""Weight pushes to a rollout server by broadcast instead of HTTP bodies (rollout.server_weight_transport
= gloo | nccl): a process group of two, the trainer's pushing process (rank 0) and the server (rank 1).

The trainer owns the group's TCP store and asks the server to join (POST /group). Each push is sent
in chunks:
  1. The trainer POSTs the chunk's names, shapes and dtypes (/weights_stream).
  2. The server checks them and writes its verdict under the chunk's key in the store.
  3. The trainer broadcasts the tensors only after an "ok", so a refused chunk never leaves it waiting
     in a collective.
This group is separate from the training processes' own group.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import urlparse

import torch
import torch.distributed as dist

BACKENDS = ("gloo", "nccl")


@dataclass
class Pair:
    store: object           # dist.TCPStore (the trainer's is the master)
    group: object           # dist.ProcessGroupGloo / ProcessGroupNCCL of size 2
    device: torch.device    # where broadcast tensors live: CPU for gloo, the GPU for NCCL


def open_pair(host: str, port: int, rank: int, backend: str, timeout_s: float) -> Pair:
    """Join the two-member group (blocks until both sides have joined)."""
    if backend not in BACKENDS:
        raise ValueError(f"weight transport backend must be one of {BACKENDS}, got {backend!r}")
    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, port, 2, rank == 0, timeout=timeout, wait_for_workers=False)
    if backend == "gloo":
        return Pair(store, dist.ProcessGroupGloo(store, rank, 2, timeout), torch.device("cpu"))
    if not torch.cuda.is_available():
        raise ValueError("weight transport nccl needs a CUDA GPU on both sides; use gloo or http")
    opts = dist.ProcessGroupNCCL.Options()
    opts._timeout = timeout
    return Pair(store, dist.ProcessGroupNCCL(store, rank, 2, opts), torch.device("cuda", torch.cuda.current_device()))


def broadcast(pair: Pair, tensor: torch.Tensor) -> None:
    """Send (rank 0) or receive (rank 1) one tensor in place."""
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    pair.group.broadcast([tensor], opts).wait()


def wait_for(pair: Pair, key: str, still_waiting) -> str | None:
    """The store value under `key` once written, or None when `still_waiting()` turns false first."""
    while not pair.store.check([key]):
        if not still_waiting():
            return pair.store.get(key).decode() if pair.store.check([key]) else None
        time.sleep(0.002)
    return pair.store.get(key).decode()


def address_towards(url: str) -> str:
    """This machine's address on the route to `url`'s host (what the server connects back to)."""
    host = urlparse(url).hostname or "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))  # no packet is sent: this only picks the route
        return s.getsockname()[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]
