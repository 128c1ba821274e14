"""The one way a benchmark writes its result record into benchmarks/results/.

`save_result(name, result)` adds what every record carries beside its numbers (the command, the
machine, the date and the load); `write_json(path, record)` writes a record that already carries
its own (a `--out` path, a seed archive, a republished summary)."""

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


def write_json(path: str | Path, record: dict, **dumps_kw) -> Path:
    """Write `record` to `path` as it is (JSON, indent 2 unless `dumps_kw` says otherwise, one final newline);
    for a record that already carries its own command, date and machine. Return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, **{"indent": 2, **dumps_kw}) + "\n")
    return path


def save_result(name: str, result: dict) -> Path:
    """Write results/<name> with command, machine, date and load average added; return the path."""
    record = {"command": "python " + " ".join(sys.argv), "date": datetime.date.today().isoformat(),
              "machine": machine(), "loadavg_1_5_15_at_end": list(os.getloadavg()), **result}
    dest = write_json(RESULTS / name, record, default=float)
    print(f"wrote {dest}")
    return dest
