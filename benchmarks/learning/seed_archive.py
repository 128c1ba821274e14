"""Per-seed results of a many-seed comparison, kept in benchmarks/results/ so that seeds add up
across sessions: results/arith_compare_<name>_seeds.json holds, per seed, every arm's report row,
curves and per-question evaluation results, with the commit the runs trained on."""

from __future__ import annotations

import copy
import datetime
import json
import math
import subprocess
from pathlib import Path

from benchmarks.bench_record import RESULTS, write_json


class ArchiveError(ValueError):
    """The archive under this name was made with other settings."""


def load(name: str, fingerprint: dict, folder: Path = RESULTS) -> dict:
    """The archive of comparison `name` (a new one if none); its settings must equal `fingerprint`."""
    p = Path(folder) / f"arith_compare_{name}_seeds.json"
    if not p.exists():
        return {"name": name, "fingerprint": fingerprint, "seeds": {}, "path": str(p)}
    archive = json.loads(p.read_text())
    if archive["fingerprint"] != fingerprint:
        raise ArchiveError(f"{p.name} was made with {archive['fingerprint']}, not {fingerprint}: use another --name")
    archive["path"] = str(p)
    return archive


def load_existing(name: str, folder: Path = RESULTS) -> dict:
    """The archive of comparison `name` as it was made (no settings check: for rebuilding its report)."""
    p = Path(folder) / f"arith_compare_{name}_seeds.json"
    if not p.exists():
        raise ArchiveError(f"no archive {p.name} in {folder}")
    return {**json.loads(p.read_text()), "path": str(p)}


def save(archive: dict) -> None:
    body = {k: v for k, v in archive.items() if k != "path"}
    write_json(archive["path"], body, indent=None, separators=(",", ":"))


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=RESULTS, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def add_seed(archive: dict, seed: int, report: dict, at_commit: str | None = None) -> None:
    """Archive one seed from a comparison report JSON (flows.compare.report.write_report's document)."""
    out = []
    for row in report["rows"]:
        if row.get("seed") != seed:
            continue
        key = f"{row['arm']}/s{seed}"
        out.append({"row": row, "curves": report["curves"][key], "questions": report["eval_questions"].get(key, {})})
    missing = set(archive["fingerprint"]["arms"]) - {r["row"]["arm"] for r in out}
    if missing:
        raise ArchiveError(f"seed {seed}: the report has no row for arm(s) {sorted(missing)}")
    archive["seeds"][str(seed)] = {"commit": at_commit or commit(), "date": datetime.date.today().isoformat(),
                                   "results": out}


def import_report(archive: dict, path: Path, at_commit: str) -> list[int]:
    """Archive every seed of an earlier report whose arms are complete; returns the seeds added."""
    report = json.loads(path.read_text())
    seeds = sorted({r["seed"] for r in report["rows"] if isinstance(r.get("seed"), int)})
    added = []
    for seed in seeds:
        if str(seed) not in archive["seeds"]:
            add_seed(archive, seed, report, at_commit)
            added.append(seed)
    return added


def merge(archive: dict, other_name: str, folder: Path | None = None) -> list[int]:
    """Add the seeds of archive `other_name` (a second worker's, same settings) that `archive` lacks;
    returns the seeds added. Different settings are refused like `load`."""
    folder = Path(folder) if folder else Path(archive["path"]).parent
    if not (folder / f"arith_compare_{other_name}_seeds.json").exists():
        raise ArchiveError(f"no archive named {other_name!r} in {folder}")
    other = load(other_name, archive["fingerprint"], folder)
    added = sorted((s for s in other["seeds"] if s not in archive["seeds"]), key=int)
    for s in added:
        archive["seeds"][s] = copy.deepcopy(other["seeds"][s])
    return [int(s) for s in added]


def results(archive: dict) -> list[dict]:
    """Every archived (arm, seed) as compare_report's results, seed-major; rows get `bucket_occupancy`
    from their curves when an older report lacks it."""
    from flows.compare.report import bucket_occupancy

    out = []
    for seed in sorted(archive["seeds"], key=int):
        for r in _nan(copy.deepcopy(archive["seeds"][seed]["results"])):
            r["row"].setdefault("bucket_occupancy", bucket_occupancy(r["curves"].get("buckets", {})))
            out.append(r)
    return out


def _nan(obj):
    """JSON stores NaN as null (compare_report._finite); numbers are NaN again for the statistics."""
    if isinstance(obj, dict):
        return {k: _nan(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_nan(v) for v in obj]
    return math.nan if obj is None else obj
