"""One GPU's iteration through the library loop (no Prefect, no MLflow): stage split, decode tokens/s,
train-step MFU and peak GPU memory per stage against exgrpo_core/training/memory_plan.py.

    python benchmarks/speed/gpu_step.py --config gpu-0.5b --steps 3
    python benchmarks/speed/gpu_step.py --config gpu-0.5b --steps 3 --tag before --set ...

Opens a session (SQLite in a temporary folder, the real verifier) and runs `loop.run_iteration`.
The team's sampling, scoring and optimiser calls are timed with the GPU synchronised before and
after, and the allocator's peak is reset before each, so each stage has its own peak. Medians over
the iterations after the first (start-up, CUDA kernels loaded). MFU = model FLOPs of the optimiser
call (flops.py, PaLM's convention: gradient-checkpoint recompute is not counted) over its
synchronised time, over the dense bf16 peak (`--peak-tflops`, else by GPU name as in step_timing.py).
The memory plan is computed for the same shape with world = 1 and train.micro_batch_tokens, without
its vLLM rows (the transformers engine samples here; its KV cache is measured, not planned).
Writes benchmarks/results/gpu_step_<config>[_<tag>].json.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

STAGES = ["rollout", "verify", "buffer", "select", "train", "iteration"]  # (log: the flow's, not the loop's)


def _timed(fn, name: str, record: dict):
    """Wrap a team call: GPU synchronised around it, its seconds and allocator peak recorded."""
    import torch

    gpu = torch.cuda.is_available()  # on CPU (a smoke run) the memory columns read 0

    def run(*args, **kwargs):
        if gpu:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        if gpu:
            torch.cuda.synchronize()
        entry = {"s": time.perf_counter() - t0,
                 "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if gpu else 0.0,
                 "reserved_gib": torch.cuda.max_memory_reserved() / 2**30 if gpu else 0.0}
        if name == "generate":  # the decode loop runs to the longest response, every row in the batch
            lengths = [len(g.response_ids) for group in out for g in group]
            entry.update(rows=len(lengths), tokens=sum(lengths), decode_steps=max(lengths, default=0))
        record.setdefault(name, []).append(entry)
        return out
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="gpu-0.5b")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--tag", default="")
    ap.add_argument("--set", action="append", default=[], help="extra config overrides")
    ap.add_argument("--peak-tflops", type=float, default=None)
    args = ap.parse_args()
    import torch

    from exgrpo_core import loop
    from exgrpo_core.config.load import load_config
    from exgrpo_core.run.session import open_session
    from exgrpo_core.training import memory_plan as mp

    out_dir = Path(tempfile.mkdtemp(prefix="exgrpo-gpu-"))
    cfg = load_config(args.config, [f"run.output_dir={out_dir}", f"run.db_url=sqlite:///{out_dir / 'x.db'}",
                                    "run.resume=never", f"run.steps={args.steps}", *args.set])
    t0 = time.perf_counter()
    s = open_session(cfg)
    open_s = time.perf_counter() - t0
    params_gib = torch.cuda.memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0
    record: dict = {}
    for op in ("generate", "score", "optimise"):
        setattr(s.team, op, _timed(getattr(s.team, op), op, record))
    model = s.accelerator.unwrap_model(s.model)
    info = {"master_weights_dtype": str(next(model.parameters()).dtype), "session_open_s": open_s,
            "weights_after_open_gib": params_gib, "shape": mp.ModelShape.from_hf_config(model.config)}
    steps = []
    try:
        for _ in range(args.steps):
            steps.append(loop.run_iteration(s))
            print({k: round(v, 3) for k, v in steps[-1].items() if k.startswith(("perf/", "loss/total", "rollout/"))},
                  flush=True)
            report(args, cfg, steps, record, info)  # after every step: a run cut short still leaves its numbers
    finally:
        s.close()


def report(args, cfg, steps: list[dict], record: dict, info: dict) -> None:
    import torch

    from exgrpo_core.training import memory_plan as mp
    from benchmarks.speed.step_timing import device

    shape = info.pop("shape", None) or info["_shape"]
    info["_shape"] = shape
    later = steps[1:] or steps
    med = lambda xs: statistics.median(xs)  # noqa: E731
    stages = {k: med([st[f"perf/{k}_s"] for st in later]) for k in STAGES}
    calls = {op: {k: med([c[k] for c in v[1:] or v]) for k in v[0] if k != "rows"} for op, v in record.items()}
    gen = calls["generate"]
    machine, peak = device()
    peak = args.peak_tflops or peak
    train_tflops = med([st["perf/train_tflops"] for st in later])
    mb_tokens = cfg.train.micro_batch_tokens or cfg.train.micro_batch_size * (
        cfg.rollout.max_prompt_tokens + cfg.rollout.max_response_tokens)
    plan = mp.memory_plan(shape, world=1, micro_batch_tokens=mb_tokens)
    rows = {k: v for k, v in plan.rows.items() if not k.startswith("vLLM")}
    result = {
        "command": "python " + " ".join(sys.argv), "date": datetime.date.today().isoformat(), "machine": machine,
        "torch": torch.__version__, "preset": args.config, "overrides": args.set, "steps_done": len(steps),
        "measured_steps": "1.." + str(len(steps) - 1) if len(steps) > 1 else "0 (warm-up only)",
        "params": shape.params, **{k: v for k, v in info.items() if not k.startswith("_")},
        "median_stage_seconds": stages, "median_team_calls": calls,
        "decode_tokens_per_s": gen["tokens"] / gen["s"],
        "decode_row_steps_per_s": record["generate"][-1]["rows"] * gen["decode_steps"] / gen["s"],
        "train_tflops": train_tflops, "peak_tflops": peak, "train_mfu": train_tflops / peak if peak else None,
        "train_tokens_per_s": med([st["perf/train_tokens_per_s"] for st in later]),
        "memory_plan_micro_batch_tokens": mb_tokens, "memory_plan_gib": rows,
        "memory_plan_total_gib": sum(rows.values()),
        "peak_allocated_gib": max(c["peak_gib"] for c in calls.values()),
        "per_step": steps,
    }
    print(f"\n{args.config}{' ' + args.tag if args.tag else ''} on {machine}: medians over steps {result['measured_steps']}")
    for k in STAGES:
        print(f"  {k:<10} {stages[k]:8.2f} s  {stages[k] / stages['iteration']:6.1%}")
    for op, c in calls.items():
        print(f"  team.{op:<9} {c['s']:8.2f} s  peak {c['peak_gib']:6.2f} GiB (reserved {c['reserved_gib']:.2f})")
    print(f"  decode {result['decode_tokens_per_s']:,.0f} tok/s ({gen['tokens']:,.0f} tokens, {gen['decode_steps']:.0f} "
          f"decode steps, {result['decode_row_steps_per_s']:,.0f} row-steps/s); train {train_tflops:.1f} TFLOP/s = MFU "
          f"{(result['train_mfu'] or 0):.1%}; master weights {info['master_weights_dtype']}")
    print(f"  memory plan (world 1, {mb_tokens} tokens): {result['memory_plan_total_gib']:.2f} GiB; "
          + ", ".join(f"{k} {v:.2f}" for k, v in rows.items()))
    name = f"gpu_step_{args.config}{'_' + args.tag if args.tag else ''}.json"
    from benchmarks.bench_record import RESULTS, write_json

    dest = write_json(Path(os.environ.get("OUT") or RESULTS) / name, result)
    print(f"wrote {dest}", flush=True)


if __name__ == "__main__":
    main()
