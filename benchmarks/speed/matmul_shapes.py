"""fp32 matmul rate per CPU-second at SmolLM2-135M's shapes against the 2048^2 rate (the floor's).

    python benchmarks/speed/matmul_shapes.py --threads 1

Rows M = 30 (a decode step's batch) and 240 (a train micro-batch: 8 rows x ~30 tokens); weights
576 x {576, 192, 1536}, 1536 x 576 and the 576 x 49,152 output head; and the weight-gradient products
of backward ([k, M] x [M, n]). Best of 5 per shape. Writes results/matmul_shapes.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SHAPES = ((576, 576), (576, 192), (576, 1536), (1536, 576), (576, 49152))


def rate(m: int, k: int, n: int, repeats: int = 5) -> float:
    """GFLOP per CPU-second of [m, k] x [k, n] (best of `repeats`)."""
    import torch

    a, b = torch.randn(m, k), torch.randn(k, n)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        torch.mm(a, b)
        best = min(best, time.process_time() - t0)
    return 2 * m * k * n / best / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    import torch

    from benchmarks.bench_record import save_result

    torch.set_num_threads(args.threads)
    uptime = [os.popen("uptime").read().strip()]
    out = {"threads": args.threads, "square_2048": rate(2048, 2048, 2048), "forward": {}, "weight_grad": {}}
    for m in (30, 240):
        out["forward"][str(m)] = {f"{k}x{n}": rate(m, k, n) for k, n in SHAPES}
    out["weight_grad"]["240"] = {f"{k}x{n}": rate(k, 240, n) for k, n in SHAPES}
    uptime.append(os.popen("uptime").read().strip())
    out["uptime"] = uptime
    for key in ("forward", "weight_grad"):
        for m, row in out[key].items():
            print(key, m, {s: round(v / out["square_2048"], 2) for s, v in row.items()})
    print(f"2048^2: {out['square_2048']:.1f} GFLOP per CPU-second", *uptime, sep="\n")
    save_result("matmul_shapes.json", out)


if __name__ == "__main__":
    main()
