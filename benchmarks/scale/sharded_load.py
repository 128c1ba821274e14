"""Peak resident memory per process while FSDP2 loads a model at world 2 (gloo, CPU): before and after
start-up on the meta device.

    python benchmarks/scale/sharded_load.py                       # ~436 MB float32 model (109 M parameters)
    python benchmarks/scale/sharded_load.py --hidden 512 --layers 4 --out /tmp/small.json

For each source (a Hugging Face folder; a checkpoint with weight shards, run.checkpoint_weights=sharded)
and each path, two fresh processes load the model and shard it over both:
  before  the old start-up: every process loads the whole float32 model (models.load_policy), then
          fsdp.shard_model shards it
  after   run/sharded_start.py: built on the meta device, sharded, then filled from rank 0's broadcast
          (HF folder) or from each process's part of the weight shards
Per process: the growth of its peak RSS (VmHWM, reset just before the load) over the load, against one
shard and one whole model. The baseline is taken after the imports and the process group. Prints a Markdown table; JSON
with the command, machine and date to --out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile

import torch
import torch.multiprocessing as mp

MB = 2 ** 20


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) / 1024  # kB


def _reset_peak() -> float:
    """Reset this process's peak RSS (VmHWM) to its current RSS and return that (MB). ru_maxrss would not
    do: a spawned child starts with its parent's peak."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_mb("VmRSS")


def _init(rank: int, port: int) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_WORLD_SIZE="2", OMP_NUM_THREADS="1")
    dist.init_process_group("gloo", rank=rank, world_size=2)


def _load(rank: int, port: int, path: str, source: str, out) -> None:
    import accelerate  # noqa: F401  (imported before the baseline, as every path imports it)
    import torch.distributed as dist
    import torch.distributed.checkpoint.state_dict  # noqa: F401

    from exgrpo_core.models import load as models
    from exgrpo_core.run import sharded_start
    from exgrpo_core.training import fsdp

    _init(rank, port)
    torch.zeros(1 << 16).sum()
    dist.barrier()
    before = _reset_peak()
    if path == "before":
        model, _ = models.load_policy(source)
        model = fsdp.shard_model(model, torch.device("cpu"), bf16=False, shape=(2,))
    else:
        model, _ = sharded_start.load_sharded_policy(source, device=torch.device("cpu"), bf16=False, shape=(2,))
    grown = _status_mb("VmHWM") - before
    shard = sum(p.to_local().numel() * p.element_size() for p in model.parameters()) / MB
    whole = sum(p.numel() * p.element_size() for p in model.parameters()) / MB
    dist.barrier()
    dist.destroy_process_group()
    out.put((rank, {"grown_mb": grown, "shard_mb": shard, "whole_mb": whole}))


def _write_shards(rank: int, port: int, hf: str, folder: str, out) -> None:
    import torch.distributed as dist

    from exgrpo_core.run import checkpoint, sharded_start
    from exgrpo_core.training import fsdp

    _init(rank, port)
    model, tok = sharded_start.load_sharded_policy(hf, device=torch.device("cpu"), bf16=False, shape=(2,))
    if rank == 0:
        model.config.save_pretrained(folder)
        tok.save_pretrained(folder)
    fsdp.save_model_shards(model, os.path.join(folder, checkpoint.MODEL_SHARDS))
    dist.barrier()
    dist.destroy_process_group()
    out.put((rank, {}))


def _two(target, *args) -> dict:
    from exgrpo_core.rollout.remote import free_port

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, port, *args, q)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(q.get(timeout=900) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    if any(p.exitcode for p in procs):
        raise SystemExit(f"a process failed: exit codes {[p.exitcode for p in procs]}")
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--intermediate", type=int, default=None, help="default 3 x hidden")
    ap.add_argument("--out", default="benchmarks/results/sharded_load.json")
    a = ap.parse_args()
    from exgrpo_core.models.build import build_tiny_model, build_tiny_tokenizer, save_policy

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        hf, shards = os.path.join(tmp, "hf"), os.path.join(tmp, "shards")
        tok = build_tiny_tokenizer()
        save_policy(build_tiny_model(tok, hidden_size=a.hidden, num_layers=a.layers, num_heads=8,
                                     intermediate_size=a.intermediate or 3 * a.hidden), tok, hf)
        _two(_write_shards, hf, shards)
        for name, source in (("HF folder", hf), ("weight shards", shards)):
            for path in ("before", "after"):
                got = _two(_load, path, source)
                rows.append({"source": name, "path": path, **{f"rank{r}_grown_mb": got[r]["grown_mb"] for r in (0, 1)},
                             "shard_mb": got[0]["shard_mb"], "whole_mb": got[0]["whole_mb"]})
    lines = ["| source | path | whole model MB | shard MB | rank 0 peak RSS growth MB | rank 1 peak RSS growth MB |",
             "|---|---|---:|---:|---:|---:|"]
    lines += [f"| {r['source']} | {r['path']} | {r['whole_mb']:.0f} | {r['shard_mb']:.0f} | {r['rank0_grown_mb']:.0f} "
              f"| {r['rank1_grown_mb']:.0f} |" for r in rows]
    print("\n".join(lines))
    record = {"command": "python " + " ".join(sys.argv), "date": datetime.date.today().isoformat(),
              "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}", "rows": rows}
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
