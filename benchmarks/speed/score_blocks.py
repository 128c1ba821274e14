"""Scoring in blocks: the [M, V] logits cut into `chunk` positions by slicing (each block's backward a
zero-filled [M, V] that autograd adds up; the code before this change) or by `policy.split_blocks` (one
[M, V] gradient). Forward + backward of log p and entropy through a head [M, H] @ [H, V], interleaved
rounds, median seconds and the [M, V] tensors the backward makes.

    python benchmarks/speed/score_blocks.py --positions 4096 --vocab 49152 --hidden 576 --rounds 5
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from exgrpo_core.training import policy  # noqa: E402


class Made(TorchDispatchMode):
    """New tensors of `numel` elements made (views not counted)."""

    def __init__(self, numel: int):
        super().__init__()
        self.numel, self.count = numel, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.numel() == self.numel and not func.is_view:
            self.count += 1
        return out


def sliced(flat: torch.Tensor, rows: int) -> list[torch.Tensor]:
    return [flat[s:s + rows] for s in range(0, flat.shape[0], rows)]


def one_pass(blocks, hidden, weight, targets, chunk, count=False) -> tuple[float, int]:
    hidden.grad = weight.grad = None
    t0 = time.perf_counter()
    flat = hidden @ weight.t()  # [M, V]
    pieces = [policy._block_scores(b, t, 1.0, True) for b, t in zip(blocks(flat, chunk), targets.split(chunk))]
    loss = sum(lp.sum() + 0.01 * h.sum() for lp, h in pieces)
    mode = Made(flat.numel()) if count else None
    with mode or contextlib.nullcontext():
        loss.backward()
    return time.perf_counter() - t0, (mode.count if mode else -1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--positions", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "results" / "score_blocks.json"))
    a = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(a.positions, a.hidden, generator=g, requires_grad=True)
    weight = (0.02 * torch.randn(a.vocab, a.hidden, generator=g)).requires_grad_()
    targets = torch.randint(0, a.vocab, (a.positions,), generator=g)
    ways = {"sliced (before)": sliced, "split_blocks (now)": policy.split_blocks}
    made = {k: one_pass(f, hidden, weight, targets, a.chunk, count=True)[1] for k, f in ways.items()}
    times = {k: [] for k in ways}
    for _ in range(a.rounds):  # interleaved
        for k, f in ways.items():
            times[k].append(one_pass(f, hidden, weight, targets, a.chunk)[0])
    res = {"shape": vars(a), "threads": torch.get_num_threads(), "load_avg": os.getloadavg(),
           "median_s": {k: statistics.median(v) for k, v in times.items()}, "seconds": times,
           "full_size_tensors_in_backward": made}
    print(f"[M, V] = [{a.positions}, {a.vocab}] float32 ({a.positions * a.vocab * 4 / 2**30:.2f} GiB), blocks of "
          f"{a.chunk}, {torch.get_num_threads()} threads, load {os.getloadavg()[0]:.1f}")
    print("| blocks | median s (forward + backward) | [M, V] tensors made in backward |\n|---|---:|---:|")
    for k in ways:
        print(f"| {k} | {res['median_s'][k]:.3f} | {made[k]} |")
    Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
