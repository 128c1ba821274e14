"""Whole training steps with `run.malloc=reuse` against glibc's defaults (`system`), one process per run.

    python benchmarks/speed/malloc_reuse.py --config cpu-demo --steps 3 --warmup 1 --rounds 2 --threads 1 --tag b2 \
        --set train.batch_size=2 --set train.mini_batch_size=2 --set rollout.max_response_tokens=32

The setting is process-wide, so every run is its own child process (library loop, no orchestrator),
the modes alternating (system, reuse, reuse, system, ...) with the same seed. Per measured step: user
and system CPU seconds (the page faults of fresh mmaps are system time), wall seconds and the rollout /
train phases; per run: minor page faults, peak resident memory, and a SHA-1 of the final weights,
which must be equal across modes (same numbers, tested here on every run). Writes
results/malloc_reuse_<preset>_<tag>.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def child(args) -> dict:
    import torch

    from exgrpo_core import loop, metrics as M
    from exgrpo_core.config.load import load_config
    from exgrpo_core.run.session import open_session

    torch.set_num_threads(args.threads)
    out = tempfile.mkdtemp(prefix="exgrpo-malloc-")
    cfg = load_config(args.config, [f"run.output_dir={out}", f"run.steps={args.warmup + args.steps}",
                                    "run.checkpoint_every=0", "run.resume=never", f"run.malloc={args.child}", *args.set])
    s = open_session(cfg)
    steps = []
    faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0, w0 = os.times(), time.perf_counter()
        st = loop.run_iteration(s)
        t1 = os.times()
        steps.append({"user": t1.user - t0.user, "sys": t1.system - t0.system, "wall": time.perf_counter() - w0,
                      "rollout": st[M.TIME_ROLLOUT], "train": st[M.TIME_TRAIN],
                      "tokens": st[M.RESPONSE_LENGTH] * st[M.RESPONSES]})
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0
    digest = hashlib.sha1()
    for name, p in sorted(s.accelerator.unwrap_model(s.model).state_dict().items()):
        digest.update(name.encode() + p.detach().cpu().numpy().tobytes())
    s.close()
    return {"mode": args.child, "steps": steps[args.warmup:], "minor_faults_measured": faults,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "weights_sha1": digest.hexdigest()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="cpu-demo")
    ap.add_argument("--steps", type=int, default=3, help="measured steps per run")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2, help="pairs of runs (one per mode)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tag", default="")
    ap.add_argument("--set", action="append", default=[], help="config overrides for every run")
    ap.add_argument("--child", choices=["reuse", "system"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return

    from benchmarks.bench_record import save_result

    uptime = [os.popen("uptime").read().strip()]
    runs = []
    for r in range(args.rounds):
        for mode in (("system", "reuse") if r % 2 == 0 else ("reuse", "system")):
            cmd = [sys.executable, __file__, "--child", mode, "--config", args.config, "--steps", str(args.steps),
                   "--warmup", str(args.warmup), "--threads", str(args.threads)] + [x for v in args.set for x in ("--set", v)]
            env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
            if proc.returncode or not line:
                sys.exit(f"child run ({mode}) failed:\n{proc.stderr[-3000:]}")
            run = json.loads(line[0][7:])
            runs.append(run)
            med = {k: statistics.median(st[k] for st in run["steps"]) for k in ("user", "sys", "wall", "train", "rollout")}
            print(f"round {r} {mode:>6}: per step user {med['user']:6.2f} sys {med['sys']:5.2f} wall {med['wall']:6.2f} "
                  f"(rollout {med['rollout']:5.2f} train {med['train']:5.2f}) faults {run['minor_faults_measured']:>8} "
                  f"peak RSS {run['peak_rss_mb']:.0f} MB", flush=True)
    uptime.append(os.popen("uptime").read().strip())
    hashes = {run["weights_sha1"] for run in runs}
    if len(hashes) != 1:
        sys.exit(f"the modes ended with different weights: {hashes}")
    summary = {}
    for mode in ("system", "reuse"):
        steps = [st for run in runs if run["mode"] == mode for st in run["steps"]]
        summary[mode] = {k: statistics.median(st[k] for st in steps) for k in ("user", "sys", "wall", "train", "rollout")}
        summary[mode]["cpu"] = statistics.median(st["user"] + st["sys"] for st in steps)
        summary[mode]["peak_rss_mb"] = max(run["peak_rss_mb"] for run in runs if run["mode"] == mode)
        summary[mode]["minor_faults_per_step"] = statistics.median(
            run["minor_faults_measured"] / len(run["steps"]) for run in runs if run["mode"] == mode)
    ratios = {k: summary["reuse"][k] / summary["system"][k] for k in ("cpu", "wall", "train", "rollout")}
    for mode, m in summary.items():
        print(f"{mode:>6}: CPU-s per step {m['cpu']:.2f} (user {m['user']:.2f} + sys {m['sys']:.2f}), wall {m['wall']:.2f}, "
              f"train {m['train']:.2f}, rollout {m['rollout']:.2f}, faults/step {m['minor_faults_per_step']:.0f}, "
              f"peak RSS {m['peak_rss_mb']:.0f} MB")
    print("reuse / system: " + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items()) + "; same final weights in every run")
    print(*uptime, sep="\n")
    save_result(f"malloc_reuse_{args.config}{'_' + args.tag if args.tag else ''}.json",
                {"preset": args.config, "overrides": args.set, "threads": args.threads, "steps": args.steps,
                 "warmup": args.warmup, "rounds": args.rounds, "uptime": uptime, "summary": summary,
                 "reuse_over_system": ratios, "weights_sha1": hashes.pop(), "runs": runs})


if __name__ == "__main__":
    main()
