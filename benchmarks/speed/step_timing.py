"""Seconds per iteration, split by stage, for a preset run through the real Prefect flow.

    python benchmarks/speed/step_timing.py --config tiny --steps 12
    python benchmarks/speed/step_timing.py --config cpu-demo --steps 4
    python benchmarks/speed/step_timing.py --config gpu-0.5b --steps 6        # on a GPU: adds MFU

Model FLOP utilisation (MFU) of the train step is its model TFLOP/s (`perf/train_tflops`,
exgrpo_core/training/flops.py) over the device's dense bf16 peak: `--peak-tflops`, or looked up by GPU name.

Sampling work: decode row-steps executed (rows in each forward, summed over steps) against useful
(tokens before each row's end), from `perf/rollout_row_steps` / `perf/rollout_useful_row_steps`, and
the machine's fp32 matmul rate per CPU-second (the floor's denominator; benchmarks/speed/flops_meter.py);
the step's FLOP floor and ratio are in trl_speed.py, which runs the loop in-process and times CPU.
`uptime` is recorded before and after.

Runs the training flow (Prefect ephemeral API unless PREFECT_API_URL is set, local MLflow, SQLite)
in a fresh temporary folder, reads the per-step `perf/*` metrics back from the experience database,
prints medians over the steps after the first (which pays start-up costs), and writes JSON to
benchmarks/results/step_timing_<preset>.json with the command, machine and date.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

STAGES = ["rollout", "verify", "buffer", "select", "train", "log", "iteration"]
PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0}  # dense, vendor sheets


def device() -> tuple[str, float | None]:
    """The machine in words and its bf16 peak TFLOP/s when it is a known GPU."""
    import torch

    base = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {platform.system()}"
    if not torch.cuda.is_available():
        return base + " (CPU only)", None
    name = torch.cuda.get_device_name(0)
    peak = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)
    return f"{base}, {torch.cuda.device_count()} x {name}", peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="tiny")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--set", action="append", default=[], help="extra config overrides")
    ap.add_argument("--peak-tflops", type=float, default=None, help="device peak for MFU (default: by GPU name)")
    args = ap.parse_args()
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

    from exgrpo_core.config.load import load_config
    from exgrpo_core.store.experience_store import ExperienceStore
    from flows.train import train

    import subprocess

    from benchmarks.bench_record import RESULTS, write_json
    from benchmarks.speed.flops_meter import matmul_rate

    uptime = [subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()]
    rate = matmul_rate()
    out_dir = Path(tempfile.mkdtemp(prefix="exgrpo-bench-"))
    cfg = load_config(args.config, [f"run.output_dir={out_dir}", f"run.steps={args.steps}",
                                    "run.checkpoint_every=0", "run.resume=never", *args.set])
    summary = train(preset=cfg.preset, config=cfg)
    store = ExperienceStore(f"sqlite:///{out_dir / cfg.run.name / 'experience.db'}")
    series = store.get_metrics(summary["run_id"])
    store.close()

    rows = {}
    for stage in STAGES:
        values = [v for step, v in sorted(series.get(f"perf/{stage}_s", [])) if step > 0]
        rows[stage] = statistics.median(values) if values else float("nan")
    rows["orchestration"] = rows["iteration"] - sum(rows[s] for s in STAGES[:-1])  # Prefect task handling etc.
    tokens = {k: statistics.median(v for s, v in series.get(f"perf/{k}", []) if s > 0)
              for k in ("rollout_tokens_per_s", "train_tokens_per_s", "train_tflops") if series.get(f"perf/{k}")}
    work = {k: statistics.median(v for s, v in series.get(f"perf/{k}", []) if s > 0)
            for k in ("rollout_row_steps", "rollout_useful_row_steps") if series.get(f"perf/{k}")}
    if len(work) == 2:
        work["executed_over_useful"] = work["rollout_row_steps"] / max(work["rollout_useful_row_steps"], 1)
    uptime.append(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    machine, peak = device()
    peak = args.peak_tflops or peak
    if peak and "train_tflops" in tokens:
        tokens["train_mfu"] = tokens["train_tflops"] / peak
    print(f"\n{args.config}: median seconds per iteration over steps 1..{args.steps - 1}")
    print(f"{'stage':<10} {'seconds':>9} {'share':>7}")
    for stage in STAGES[:-1] + ["orchestration", "iteration"]:
        share = rows[stage] / rows["iteration"] if stage != "iteration" else 1.0
        print(f"{stage:<10} {rows[stage]:>9.3f} {share:>6.1%}")
    for k, v in tokens.items():
        print(f"{k:<24} {v:>9.1%}" if k == "train_mfu" else f"{k:<24} {v:>9.3g}")
    for k, v in work.items():
        print(f"{k:<24} {v:>9.3g}")
    print(f"matmul {rate / 1e9:.1f} GFLOP per CPU-second ({__import__('torch').get_num_threads()} threads)", *uptime, sep="\n")
    result = {"command": "python " + " ".join(sys.argv), "date": datetime.date.today().isoformat(),
              "machine": machine, "peak_tflops": peak, "preset": args.config, "steps": args.steps, "median_seconds": rows, "median_tokens_per_s": tokens,
              "median_decode_row_steps": work, "matmul_gflop_per_cpu_s": rate / 1e9, "uptime": uptime}
    dest = write_json(RESULTS / f"step_timing_{args.config}.json", result)
    print(f"wrote {dest}")


if __name__ == "__main__":
    main()
