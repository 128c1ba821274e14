"""What every section of benchmarks/gpu_check.sh shares: the output folder, the JSON header (device,
torch, commit), the `--tiny` switch (automatic without CUDA) and the model of the real-shape preset.

The preset is configs/gpu-qwen0.5b-shape.yaml at full shape on a GPU; with `--tiny` its shape is cut
down (2 layers, width 64, an 8,192-token vocabulary; GQA kept) so every section runs on a CPU in seconds.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

PRESET = "gpu-qwen0.5b-shape"
TINY_SET = ["model.tiny.hidden_size=64", "model.tiny.num_layers=2", "model.tiny.num_heads=4",
            "model.tiny.intermediate_size=128", "model.hf_overrides.vocab_size=8192", "model.dtype=float32"]
"""Overrides that shrink the preset for a CPU run (4 query heads over its 2 key/value heads)."""
PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0}  # dense, vendor sheets


def parse(doc: str, extra=None) -> argparse.Namespace:
    """Common flags: --out (default $OUT, else benchmarks/results/gpu), --tiny (forced without CUDA)."""
    import torch

    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "results" / "gpu"))
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (automatic when CUDA is missing)")
    if extra:
        extra(ap)
    args = ap.parse_args()
    args.tiny = args.tiny or not torch.cuda.is_available()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    return args


def commit() -> str:
    """The checked-out commit (GPU_CHECK_COMMIT when the script set it; '+dirty' with local changes)."""
    if os.environ.get("GPU_CHECK_COMMIT"):
        return os.environ["GPU_CHECK_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "") if head.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def peak_tflops() -> float | None:
    """Dense bf16 peak of this GPU by name (None on CPU or an unknown card)."""
    name = device_name()
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


def header(section: str, args) -> dict:
    import torch

    return {"section": section, "device": device_name(), "torch": torch.__version__, "commit": commit(),
            "tiny": bool(args.tiny), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": "python " + " ".join(sys.argv)}


class Report:
    """One section's JSON file, rewritten after every `add` so a run cut short keeps what it measured."""

    def __init__(self, section: str, args):
        self.path = Path(args.out) / f"{section}.json"
        self.data = {**header(section, args), "status": "running", "results": {}}
        self.t0 = time.perf_counter()
        self.write()

    def add(self, key: str, value) -> None:
        self.data["results"][key] = value
        self.write()

    def done(self, status: str = "ok", **extra) -> None:
        self.data.update(status=status, seconds=round(time.perf_counter() - self.t0, 2), **extra)
        self.write()

    def write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        tmp.replace(self.path)


def preset_config(tiny: bool, extra: list[str] | None = None):
    """The real-shape preset (shrunk with `tiny`), with a throw-away output folder."""
    import tempfile

    from exgrpo_core.config.load import load_config

    out = tempfile.mkdtemp(prefix="gpu-check-")
    sets = [f"run.output_dir={out}", f"run.db_url=sqlite:///{out}/x.db", *(TINY_SET if tiny else []), *(extra or [])]
    return load_config(PRESET, sets)


def preset_model(cfg, device=None):
    """(model, tokenizer) of the preset on `device` (CUDA when present), random weights, nothing downloaded."""
    import torch

    from exgrpo_core.models.load import load_policy

    m = cfg.model
    model, tok = load_policy(m.name_or_path, dtype=m.dtype, tiny=m.tiny.model_dump(), seed=0,
                             hf_overrides=m.hf_overrides)
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return model.to(device), tok


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def cuda_kernels(prof) -> tuple[list, float]:
    """(CUDA kernel events, their GPU time in ms) of a finished torch.profiler run."""
    kernels = [e for e in prof.events() if getattr(e, "device_type", None) is not None and e.device_type.name == "CUDA"]
    busy_us = sum(e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total for e in kernels)
    return kernels, busy_us / 1e3
