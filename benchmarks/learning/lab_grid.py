"""The replay lab's pre-registered grid (docs/benchmarks/preregistration_replay_lab.md): on_policy and
exgrpo on arith3 at r*/1.5, r*, 1.5 r* (r* from the pilot) x seeds 0-19, each arm judged at its own best
rate; then the lab's other arms at the same rates on seeds 0-7, exploratory.

    nohup nice -n 19 .venv/bin/python -m benchmarks.learning.lab_grid > runs/lab_grid.out 2>&1 &   # run / resume
    python -m benchmarks.learning.lab_grid --status     # seed counts per cell, nothing else
    python -m benchmarks.learning.lab_grid --final      # the pre-registered analysis (all planned seeds in)
    python -m benchmarks.learning.lab_grid --merge-from ../lab2/benchmarks/results   # a second worker's seeds
    MKL_CBWR=COMPATIBLE python -m benchmarks.learning.lab_grid ...   # MKL's reproducible paths (recorded)

Seed-major over the primary cells (every rate's cell, both arms, for a seed before the next seed), then
the exploratory cells the same way. Each cell is a per-seed archive (seed_archive.py) named
lab3-lr<rate> or lab3x-lr<rate>; every archived seed names its code (HEAD + uncommitted diff) and its
machine (CPU model and flags, torch.__config__.show(), MKL_CBWR). While the grid runs, the compare flow's
own output (tables, per-run evaluations) goes to runs/lab_grid/compare.log, not to the terminal: the
driver prints seed counts per cell only, and computes no comparison statistic before --final.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_record import RESULTS, save_result  # noqa: E402
from benchmarks.learning import seed_archive  # noqa: E402
from benchmarks.learning.arith_compare import parse_seed_range, start_model  # noqa: E402
from benchmarks.learning.lr_grid import code_state, heldout_differences  # noqa: E402

PRESET = "arith3"
R_STAR = 3.2e-4  # on-policy's best pilot rate at B = 32, where the gate passed (docs/benchmarks/replay_lab.md)


def rate_text(x: float) -> str:
    """1.2e-4 style, three significant digits at most (the cells' names)."""
    mantissa, exp = f"{x:.2e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exp)}"


RATES = [rate_text(R_STAR / 1.5), rate_text(R_STAR), rate_text(R_STAR * 1.5)]
REGISTERED = True  # set in the commit that registered the plan; before it the driver trained nothing
PRIMARY = {"prefix": "lab3", "arms": ["on_policy", "exgrpo"], "seeds": "0-19"}
# seq_tis / seq_mask are left out: on this engine the sampler is the trainer (fp32 transformers), so they
# equal exgrpo exactly; they act under vLLM
EXPLORATORY = {"prefix": "lab3x", "arms": ["prompt_replay", "on_policy_ds", "dynamic_sampling", "max_age_8",
                                           "age_decay"], "seeds": "0-7"}
PARTS = {"primary": PRIMARY, "exploratory": EXPLORATORY}
LOG_DIR = ROOT / "runs" / "lab_grid"


def cell_name(part: dict, rate: str) -> str:
    return f"{part['prefix']}-lr{rate}"


def fingerprint(part: dict, rate: str, start: str) -> dict:
    return {"preset": PRESET, "arms": part["arms"], "overrides": [f"train.lr={rate}"], "start_model": start}


def machine_record() -> dict:
    """What a run's numbers depend on beyond the code: the CPU (model, flags), torch's build and MKL_CBWR."""
    import torch

    cpu: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "flags") and key.strip() not in cpu:
                cpu[key.strip()] = value.strip()
    return {"cpu_model": cpu.get("model name", platform.processor()), "cpu_flags": cpu.get("flags", ""),
            "cpus": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version(),
            "torch": torch.__version__, "torch_config": torch.__config__.show(),
            "mkl_cbwr": os.environ.get("MKL_CBWR", ""), "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "")}


def machine_key(record: dict) -> str:
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:12]


@contextlib.contextmanager
def sealed(path: Path):
    """Everything written to the process's stdout and stderr (Prefect's console handler included) goes to
    `path` instead of the terminal while inside."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "ab") as f:  # at the descriptors: sys.stdout / sys.stderr, the streams Prefect's handlers
        os.dup2(f.fileno(), 1)    # hold and child processes all write there (swapping sys.stdout instead made
        os.dup2(f.fileno(), 2)    # Prefect's print-to-log handler recurse)
        try:
            yield
        finally:
            sys.stdout.flush()  # what Python buffered inside goes to the file too
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def counts_line(cells: dict[str, dict], seeds: dict[str, list[int]]) -> str:
    """Seed counts per cell: the only progress the driver shows."""
    per = ", ".join(f"{name}: {sum(str(s) in a['seeds'] for s in seeds[name])}/{len(seeds[name])}"
                    for name, a in cells.items())
    return f"seeds archived per cell: {per}; load {os.getloadavg()[0]:.1f}"


def plan(parts: list[str], only: list[int] | None) -> list[tuple[dict, int, str]]:
    """(part, seed, rate) in the order they run: part by part, seed-major, rates in order."""
    out = []
    for p in parts:
        part = PARTS[p]
        out += [(part, s, r) for s in parse_seed_range(part["seeds"]) if only is None or s in only for r in RATES]
    return out


def load_cells(start: str, parts: list[str]) -> dict[str, dict]:
    return {cell_name(PARTS[p], r): seed_archive.load(cell_name(PARTS[p], r), fingerprint(PARTS[p], r, start), RESULTS)
            for p in parts for r in RATES}


def run(parts: list[str], only: list[int] | None, output_dir: str, threads: int) -> int:
    code = code_state()
    import torch

    torch.set_num_threads(threads)
    machine = machine_record()
    start = start_model(PRESET, [])
    try:
        cells = load_cells(start, parts)
    except seed_archive.ArchiveError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    mixed = sorted({n for n, a in cells.items() for m in a.get("machines", {}).values()
                    if m.get("mkl_cbwr", "") != machine["mkl_cbwr"]})
    if mixed:  # MKL's code path changes the numbers: one setting per grid
        print(f"error: {', '.join(mixed)} archived seeds under another MKL_CBWR than this process's "
              f"({machine['mkl_cbwr'] or 'unset'}); run with the grid's setting", file=sys.stderr)
        return 2
    seeds = {cell_name(PARTS[p], r): parse_seed_range(PARTS[p]["seeds"]) for p in parts for r in RATES}
    log = LOG_DIR / "compare.log"
    with sealed(log):
        from flows.prefect_api import serve_prefect_api

        serve_prefect_api()
        from flows.compare.flow import compare
    print(counts_line(cells, seeds), flush=True)
    for part, seed, rate in plan(parts, only):
        name = cell_name(part, rate)
        archive = cells[name]
        if str(seed) in archive["seeds"]:
            continue
        t0 = time.time()
        try:
            with sealed(log):
                out = compare(preset=PRESET, overrides=[f"run.output_dir={output_dir}", f"train.lr={rate}"],
                              arms=part["arms"], seeds=[seed], name=name)
        except Exception as e:  # noqa: BLE001 - one line; the traceback is in the sealed log
            print(f"error: {name} seed {seed} failed ({type(e).__name__}); its output: {log}", file=sys.stderr)
            return 1
        seed_archive.add_seed(archive, seed, json.loads(Path(out["files"]["json"]).read_text()))
        archive.setdefault("machines", {})[machine_key(machine)] = machine
        archive["seeds"][str(seed)].update(code=code, machine=machine_key(machine))
        seed_archive.save(archive)
        print(f"{name} seed {seed} done in {time.time() - t0:.0f} s; {counts_line(cells, seeds)}", flush=True)
    return 0


def final(stopped: str | None) -> int:
    """The pre-registered analysis over the complete primary seed blocks (and the exploratory cells' seeds);
    refused before every planned primary seed is in unless `stopped` says why the grid stopped for good."""
    from benchmarks.learning import lab_grid_report

    def cells_of(part):
        return {r: seed_archive.load_existing(cell_name(part, r), RESULTS) for r in RATES
                if (RESULTS / f"arith_compare_{cell_name(part, r)}_seeds.json").exists()}

    primary, explore = cells_of(PRIMARY), cells_of(EXPLORATORY)
    planned = parse_seed_range(PRIMARY["seeds"])
    complete = [s for s in planned if len(primary) == len(RATES) and all(str(s) in a["seeds"] for a in primary.values())]
    if len(complete) < len(planned) and not stopped:
        print(f"error: {len(complete)} of {len(planned)} planned seed blocks are complete; the pre-registration "
              "allows the analysis only then (or with --stopped REASON when the grid stopped for good)", file=sys.stderr)
        return 2
    if len(complete) < 2:
        print(f"error: {len(complete)} complete seed blocks; the analysis needs at least 2", file=sys.stderr)
        return 2
    result = lab_grid_report.write(primary, explore, RATES, PRIMARY["arms"], EXPLORATORY["arms"], complete,
                                   planned=len(planned), stopped=stopped, out=RESULTS)
    save_result("lab_grid_prereg.json", result)
    print((RESULTS / "lab_grid_prereg.md").read_text())
    return 0


def merge_worker(folder: Path) -> int:
    """Add a second worker's archived seeds (its own worktree, other --seeds) to the cells here; a seed both
    hold must agree in every held-out value and the settings must be equal, else nothing is written."""
    plans, problems = [], []
    for p in PARTS.values():
        for r in RATES:
            name = cell_name(p, r)
            if not (folder / f"arith_compare_{name}_seeds.json").exists():
                continue
            other = seed_archive.load_existing(name, folder)
            here = seed_archive.load(name, other["fingerprint"], RESULTS) if not (
                RESULTS / f"arith_compare_{name}_seeds.json").exists() else seed_archive.load_existing(name, RESULTS)
            if here["fingerprint"] != other["fingerprint"]:
                problems.append(f"{name}: settings differ")
                continue
            for s in sorted(set(here["seeds"]) & set(other["seeds"]), key=int):
                if diff := heldout_differences(other["seeds"][s], here["seeds"][s], p["arms"]):
                    problems.append(f"{name} seed {s}: {', '.join(diff)}")
            plans.append((here, other, name))
    if problems:
        print(f"error: not merged, the worker's archives disagree: {'; '.join(problems)}", file=sys.stderr)
        return 2
    for here, other, name in plans:
        added = seed_archive.merge(here, name, folder)
        here.setdefault("machines", {}).update(other.get("machines", {}))
        seed_archive.save(here)
        print(f"{name}: merged seeds {added}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=["all", *PARTS], default="all", help="which cells to run (default: all, in order)")
    ap.add_argument("--seeds", default=None, help="run only these of the planned seeds (a second worker's share)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--output-dir", default=str(ROOT / "runs"))
    ap.add_argument("--status", action="store_true", help="print the seed counts per cell and stop")
    ap.add_argument("--final", action="store_true", help="the pre-registered analysis (all planned seeds in)")
    ap.add_argument("--stopped", default=None, metavar="REASON",
                    help="with --final: the grid stopped for good before all seeds; analyse the complete blocks")
    ap.add_argument("--merge-from", type=Path, default=None, metavar="DIR",
                    help="add a second worker's archived seeds from DIR (its benchmarks/results) and stop")
    a = ap.parse_args(argv)
    if a.merge_from is not None:
        if not a.merge_from.is_dir():
            print(f"error: --merge-from {a.merge_from}: no such folder", file=sys.stderr)
            return 2
        return merge_worker(a.merge_from)
    if a.final:
        return final(a.stopped)
    try:
        only = None if a.seeds is None else parse_seed_range(a.seeds)
    except ValueError:
        print(f"error: --seeds must look like 0-19 or 0,1,2 (got {a.seeds!r})", file=sys.stderr)
        return 2
    parts = list(PARTS) if a.part == "all" else [a.part]
    if a.status:
        names = [cell_name(PARTS[p], r) for p in parts for r in RATES]
        cells = {n: seed_archive.load_existing(n, RESULTS) if (RESULTS / f"arith_compare_{n}_seeds.json").exists()
                 else {"seeds": {}} for n in names}
        print(counts_line(cells, {cell_name(PARTS[p], r): parse_seed_range(PARTS[p]["seeds"])
                                  for p in parts for r in RATES}))
        return 0
    if not REGISTERED:
        print("error: the grid's plan (docs/benchmarks/preregistration_replay_lab.md) is a draft: no variant has passed "
              "the pilot gate at its on-policy r* yet; register the plan first", file=sys.stderr)
        return 2
    return run(parts, only, a.output_dir, a.threads)


if __name__ == "__main__":
    raise SystemExit(main())
