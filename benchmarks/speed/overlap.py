"""Seconds per step with rollout.overlap 0 and 1 (first increment), interleaved, on the CPU.

Each repeat opens a fresh tiny session per mode (overlap 0, then 1) and times `loop.run_iteration` over the
steps after the first (the first overlapped step has nothing sampled ahead). torch runs one intra-op thread,
so the trainer's thread and the background sampler's each use one core. The machine may be shared and
loaded: the JSON records the load average before and after.

    OMP_NUM_THREADS=1 python benchmarks/speed/overlap.py [--steps 6] [--repeats 3] [--tokens 48]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from exgrpo_core import loop  # noqa: E402
from exgrpo_core.config.load import load_config  # noqa: E402
from exgrpo_core.run.session import open_session  # noqa: E402


def half_right(texts, answers):
    return [(1.0, "correct") if i % 2 == 0 else (0.0, "wrong") for i in range(len(texts))]


def seconds_per_step(overlap: int, steps: int, tokens: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config("tiny", [f"run.output_dir={tmp}", f"run.db_url=sqlite:///{tmp}/x.db", "run.resume=never",
                                   f"run.steps={steps}", f"rollout.max_response_tokens={tokens}",
                                   f"rollout.overlap={overlap}", "buffer.start_threshold=0"])
        torch.manual_seed(0)
        s = open_session(cfg, verify=half_right)
        try:
            times = []
            for _ in range(steps):
                t0 = time.perf_counter()
                loop.run_iteration(s)
                times.append(time.perf_counter() - t0)
        finally:
            s.close()
    return times[1:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=48, help="rollout.max_response_tokens")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "overlap_cpu.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    runs: dict[int, list[float]] = {0: [], 1: []}
    for _ in range(args.repeats):
        for overlap in (0, 1):  # interleaved: a load change hits both modes alike
            runs[overlap].append(statistics.mean(seconds_per_step(overlap, args.steps, args.tokens)))
    result = {"command": "OMP_NUM_THREADS=1 python benchmarks/speed/overlap.py " + " ".join(sys.argv[1:]),
              "preset": "tiny", "steps": args.steps, "repeats": args.repeats, "max_response_tokens": args.tokens,
              "torch_threads": 1, "cpus": os.cpu_count(), "load_before": load_before, "load_after": os.getloadavg(),
              "note": "shared, loaded machine (see load averages): the other agents' work runs alongside",
              "seconds_per_step": {str(k): v for k, v in runs.items()},
              "median": {str(k): statistics.median(v) for k, v in runs.items()}}
    result["speedup"] = result["median"]["0"] / result["median"]["1"]
    print(f"{'overlap':>8} {'s/step (median)':>16}  repeats")
    for k, v in runs.items():
        print(f"{k:>8} {statistics.median(v):>16.3f}  " + " ".join(f"{x:.3f}" for x in v))
    print(f"speed-up {result['speedup']:.2f}x; load average before {load_before[0]:.1f}, after "
          f"{result['load_after'][0]:.1f} on {os.cpu_count()} CPUs")
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
