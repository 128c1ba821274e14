"""What every speed benchmark writes beside its numbers: the command, the machine, the date and the load."""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> str:
    """e.g. 'x86_64, 2 cores, Linux (CPU only)'."""
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU only"
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {platform.system()} ({gpu})"


def save_result(name: str, result: dict) -> Path:
    """Write results/<name> with command, machine, date and load average added; return the path."""
    record = {"command": "python " + " ".join(sys.argv), "date": datetime.date.today().isoformat(),
              "machine": machine(), "loadavg_1_5_15_at_end": list(os.getloadavg()), **result}
    RESULTS.mkdir(exist_ok=True)
    dest = RESULTS / name
    dest.write_text(json.dumps(record, indent=2, default=float) + "\n")
    print(f"wrote {dest}")
    return dest
