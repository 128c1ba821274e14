"""Bytes rank 0 sends every step to ship the training batch to the other processes, before and after
tensors travel beside the pickle (`training/distributed.py: broadcast`).

    python benchmarks/scale/broadcast_bytes.py                     # tiny preset's step and a paper-shaped one
    python benchmarks/scale/broadcast_bytes.py --rows 64 --prompt 64 --response 256

A batch is collated as the trainer does (`training/batch.collate`) from random rollouts of the given
shape (prompt and response lengths uniform up to the limits), then encoded the old way (the whole
(batch, settings) pickled, as broadcast_object_list sends it) and the new way (pickled records and
layout, plus the tensors' raw bytes in one flat buffer). Bytes and encode + decode time on one process
(the broadcast itself moves the same bytes either way). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import io
import pickle
import random
import time

import torch

from exgrpo_core.training import distributed as D
from exgrpo_core.training.batch import collate
from exgrpo_core.types import Rollout

SHAPES = {"tiny preset (64 rows, 32 + 64 tokens)": (64, 32, 64),
          "paper-shaped (1024 rows, 1024 + 8192 tokens)": (1024, 1024, 8192)}


def _batch(rows: int, prompt: int, response: int, seed: int = 0):
    rng = random.Random(seed)
    rollouts = []
    for i in range(rows):
        p, t = rng.randint(1, prompt), rng.randint(1, response)
        rollouts.append(Rollout(f"q{i // 8}", [rng.randrange(1000) for _ in range(p)],
                                [rng.randrange(1000) for _ in range(t)], [-1.0] * t, "", False, 0))
    return collate(rollouts, [rng.uniform(-1, 1) for _ in range(rows)], 0, [i // 8 for i in range(rows)])


def _old(obj) -> tuple[int, float]:
    t0 = time.perf_counter()
    blob = pickle.dumps(obj)
    pickle.loads(blob)
    return len(blob), time.perf_counter() - t0


def _new(obj) -> tuple[int, int, float]:
    t0 = time.perf_counter()
    tensors: list = []
    buf = io.BytesIO()
    D._TensorPickler(buf, tensors).dump(obj)
    specs = [(tuple(t.shape), t.dtype, t.device.type) for t in tensors]
    head = pickle.dumps((buf.getvalue(), specs))
    offsets, size = D._offsets(specs)
    flat = torch.empty(size, dtype=torch.uint8)
    for t, start in zip(tensors, offsets):
        flat[start:start + t.numel() * t.element_size()].copy_(t.contiguous().reshape(-1).view(torch.uint8))
    got = [flat[s:s + int(torch.Size(sh).numel()) * dt.itemsize].view(dt).reshape(sh) for (sh, dt, _), s in zip(specs, offsets)]
    D._TensorUnpickler(io.BytesIO(pickle.loads(head)[0]), got).load()
    return len(head), sum(t.numel() * t.element_size() for t in tensors), time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--response", type=int, default=256)
    a = ap.parse_args()
    shapes = {f"{a.rows} rows, {a.prompt} + {a.response} tokens": (a.rows, a.prompt, a.response)} if a.rows else SHAPES
    print("| batch | old: pickled MB | old: encode + decode s | new: pickled KB | new: tensor MB | "
          "new: encode + decode s |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, shape in shapes.items():
        obj = ("optimise", (_batch(*shape), {"n_minibatches": 2, "micro_batch_size": 4}))
        old_bytes, old_s = _old(obj)
        head, tensor_bytes, new_s = _new(obj)
        print(f"| {name} | {old_bytes / 2 ** 20:.2f} | {old_s:.3f} | {head / 1024:.1f} | {tensor_bytes / 2 ** 20:.2f} "
              f"| {new_s:.3f} |")


if __name__ == "__main__":
    main()
