"""Seconds per step: synchronous (rollout.overlap 0), overlap 1 with the sampler in a thread, and overlap 1
with the sampler in a process of its own (rollout.overlap_sampler), interleaved, on the CPU.

Each repeat opens a fresh tiny session per mode (in the order of --modes) and times `loop.run_iteration` over
the steps after the first two (the first overlapped step has nothing sampled ahead, and the second waits for
the process sampler's child to start: their times are recorded apart, `first_steps_s`). torch runs one intra-op thread on each side, so the
trainer and the sampler (thread or process) each use one core. The machine may be shared and loaded: the JSON
records the load average before and after.

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


MODES = {"sync": ["rollout.overlap=0"], "thread": ["rollout.overlap=1", "rollout.overlap_sampler=thread"],
         "process": ["rollout.overlap=1", "rollout.overlap_sampler=process"]}


def seconds_per_step(mode: str, steps: int, tokens: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config("tiny", [f"run.output_dir={tmp}", f"run.db_url=sqlite:///{tmp}/x.db", "run.resume=never",
                                   f"run.steps={steps}", f"rollout.max_response_tokens={tokens}",
                                   "buffer.start_threshold=0", *MODES[mode]])
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
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=48, help="rollout.max_response_tokens")
    ap.add_argument("--modes", default="sync,thread,process", help="comma-separated: " + ", ".join(MODES))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "overlap_sampler_cpu.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    modes = args.modes.split(",")
    load_before = os.getloadavg()
    runs: dict[str, list[float]] = {m: [] for m in modes}
    first: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(args.repeats):
        for mode in modes:  # interleaved: a load change hits every mode alike
            times = seconds_per_step(mode, args.steps, args.tokens)
            first[mode].append(times[:2])
            runs[mode].append(statistics.mean(times[2:]))
    result = {"command": "OMP_NUM_THREADS=1 python benchmarks/speed/overlap.py " + " ".join(sys.argv[1:]),
              "preset": "tiny", "steps": args.steps, "repeats": args.repeats, "max_response_tokens": args.tokens,
              "torch_threads": 1, "cpus": os.cpu_count(), "load_before": load_before, "load_after": os.getloadavg(),
              "note": "shared, loaded machine (see load averages): the other agents' work runs alongside; "
                      "seconds_per_step: mean over the steps after the first two, per repeat",
              "seconds_per_step": runs, "first_steps_s": first,
              "median": {m: statistics.median(v) for m, v in runs.items()}}
    if "sync" in runs:
        result["speedup_vs_sync"] = {m: result["median"]["sync"] / v for m, v in result["median"].items()}
    print(f"{'mode':>8} {'s/step (median)':>16} {'step 1 (median)':>16}  repeats")
    for m, v in runs.items():
        print(f"{m:>8} {statistics.median(v):>16.3f} {statistics.median(f[1] for f in first[m]):>16.2f}  "
              + " ".join(f"{x:.3f}" for x in v))
    print(f"load average before {load_before[0]:.1f}, after {result['load_after'][0]:.1f} on {os.cpu_count()} CPUs")
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
