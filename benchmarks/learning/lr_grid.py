"""The pre-registered learning-rate grid (docs/benchmarks/preregistration_lr_grid.md): on_policy and
exgrpo on arith-fast at 5 learning rates x seeds 0-23, each arm judged at its own best rate.

    nohup nice -n 19 .venv/bin/python -m benchmarks.learning.lr_grid > runs/lr_grid.log 2>&1 &   # run / resume
    # the pre-registered grid runs from a worktree frozen at 8327aca (the pre-registration's amendments)
    python -m benchmarks.learning.lr_grid --status    # seed counts per cell, nothing else
    python -m benchmarks.learning.lr_grid --final     # the pre-registered analysis (all planned seeds in)
    python -m benchmarks.learning.lr_grid --merge-from ../grid2/benchmarks/results   # a second worker's seeds

Seed-major over the whole grid: for each seed, every rate's cell (both arms, one compare-flow call)
before the next seed, so stopping leaves complete seed blocks plus at most one partial block. Each cell
is a per-seed archive (benchmarks/learning/seed_archive.py) named prereg-lr<rate>, with its
fingerprint; rerunning resumes. While it runs it prints seed counts per cell only: no comparison
statistic is computed before all planned seeds are archived, except under --final.

Reuse (the pre-registration's rule): a cell with an archived source (same preset, arms, rate and start
model) first runs its seed 0 fresh; only if every held-out value of both arms equals the source's bit
for bit are the source's other seeds imported (tagged `reused_from`). The outcome is kept in the
cell's archive under `reuse`.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_record import RESULTS, save_result  # noqa: E402
from benchmarks.learning import seed_archive  # noqa: E402
from benchmarks.learning.arith_compare import parse_seed_range, start_model  # noqa: E402

PRESET = "arith-fast"
ARMS = ["on_policy", "exgrpo"]
RATES = ["3e-5", "5.5e-5", "1e-4", "1.8e-4", "3.2e-4"]
SEEDS = "0-23"
REUSE = {"3e-5": "af-slow", "1e-4": "af-ablations-2"}  # candidate source archives (pre-registered)
CHECK_SEED = 0
HELDOUT_CURVES = ("heldout_step", "heldout_pass1", "heldout_responses")
HELDOUT_ROW = ("heldout", "heldout_avg", "heldout_start", "heldout_auc")


def cell_name(rate: str) -> str:
    return f"prereg-lr{rate}"


def fingerprint(rate: str, start: str) -> dict:
    return {"preset": PRESET, "arms": ARMS, "overrides": [f"train.lr={rate}"], "start_model": start}


def heldout_differences(fresh: dict, archived: dict, arms: list[str] = ARMS) -> list[str]:
    """Every held-out value (curves, row values, per-question results) of `arms` in which two archived
    seed entries differ, as 'arm: key' strings; empty when they agree bit for bit."""
    def by_arm(entry):
        return {r["row"]["arm"]: r for r in entry["results"]}

    a, b = by_arm(fresh), by_arm(archived)
    out = []
    for arm in arms:
        if arm not in a or arm not in b:
            out.append(f"{arm}: missing")
            continue
        out += [f"{arm}: {k}" for k in HELDOUT_CURVES if a[arm]["curves"].get(k) != b[arm]["curves"].get(k)]
        out += [f"{arm}: {k}" for k in HELDOUT_ROW if a[arm]["row"].get(k) != b[arm]["row"].get(k)]
        if a[arm].get("questions") != b[arm].get("questions"):
            out.append(f"{arm}: per-question results")
    return out


def source_problems(source: dict, rate: str, start: str) -> list[str]:
    """Why the archive `source` may not stand in for the cell at `rate` (empty: it may, once reproduced)."""
    from exgrpo_core.config.load import load_config

    fp, bad = source["fingerprint"], []
    if fp["start_model"] != start:
        bad.append(f"start model {fp['start_model']} is not today's {start}")
    if fp["preset"] != PRESET:
        bad.append(f"preset {fp['preset']}")
    if set(ARMS) - set(fp["arms"]):
        bad.append(f"arms {fp['arms']} lack {sorted(set(ARMS) - set(fp['arms']))}")
    if any(not o.startswith("train.lr=") for o in fp["overrides"]):
        bad.append(f"overrides {fp['overrides']} change more than the learning rate")
    elif load_config(PRESET, fp["overrides"]).train.lr != float(rate):
        bad.append(f"its learning rate is not {rate}")
    return bad


def import_source(archive: dict, source: dict, seeds: list[int]) -> list[int]:
    """Copy the source's seeds (ARMS only, tagged) that the cell lacks; returns the seeds added."""
    added = []
    for s in seeds:
        entry = source["seeds"].get(str(s))
        if entry is None or str(s) in archive["seeds"]:
            continue
        archive["seeds"][str(s)] = {**entry, "results": [r for r in entry["results"] if r["row"]["arm"] in ARMS],
                                    "reused_from": source["name"]}
        added.append(s)
    return added


def check_reuse(archive: dict, rate: str, start: str, seeds: list[int]) -> None:
    """The pre-registered reuse check for one cell whose seed CHECK_SEED is archived fresh; the outcome
    is recorded in archive['reuse'] and the source's seeds are imported when it passes."""
    name = REUSE[rate]
    try:
        source = seed_archive.load_existing(name, RESULTS)
    except seed_archive.ArchiveError as e:
        archive["reuse"] = {"source": name, "ok": False, "why": str(e)}
        return
    bad = source_problems(source, rate, start)
    if not bad:
        ref = source["seeds"].get(str(CHECK_SEED))
        bad = ([f"the source has no seed {CHECK_SEED}"] if ref is None else
               heldout_differences(archive["seeds"][str(CHECK_SEED)], ref))
    archive["reuse"] = {"source": name, "check_seed": CHECK_SEED, "ok": not bad, "differences": bad,
                        "checked_at_commit": seed_archive.commit(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if not bad:
        archive["reuse"]["imported_seeds"] = import_source(archive, source, seeds)


def counts_line(archives: dict[str, dict], seeds: list[int]) -> str:
    """Seed counts per cell and the complete seed blocks: the only progress the driver shows."""
    per = ", ".join(f"lr {r}: {sum(str(s) in a['seeds'] for s in seeds)}" for r, a in archives.items())
    blocks = sum(all(str(s) in a["seeds"] for a in archives.values()) for s in seeds)
    return f"seeds archived per cell ({len(seeds)} planned): {per}; complete seed blocks: {blocks}; " \
           f"load {os.getloadavg()[0]:.1f}"


def code_state() -> dict:
    """The code this process trains on: HEAD plus the shared tree's uncommitted changes (names, the SHA-256
    of `git diff HEAD`, untracked .py/.yaml files), read once at start, before the modules load; the diff
    and the untracked files are kept in runs/lr_grid_code/<head>-<diff sha>.tar.gz."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT).stdout

    diff = git("diff", "HEAD")
    untracked = [f for f in git("ls-files", "--others", "--exclude-standard").split() if f.endswith((".py", ".yaml"))]
    state = {"head": seed_archive.commit(), "uncommitted": git("diff", "--name-only", "HEAD").split(),
             "untracked": untracked, "diff_sha256": hashlib.sha256(diff.encode()).hexdigest()}
    snapshot = ROOT / "runs" / "lr_grid_code" / f"{state['head']}-{state['diff_sha256'][:12]}.tar.gz"
    snapshot.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(snapshot, "w:gz") as tar:  # the uncommitted code itself: HEAD + this rebuilds the tree
        body = diff.encode()
        info = tarfile.TarInfo("uncommitted.diff")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
        for f in untracked:
            tar.add(ROOT / f, arcname=f"untracked/{f}")
    state["snapshot"] = str(snapshot.relative_to(ROOT))
    return state


def load_cells(start: str) -> dict[str, dict]:
    return {r: seed_archive.load(cell_name(r), fingerprint(r, start), RESULTS) for r in RATES}


def run(seeds: list[int], output_dir: str, threads: int) -> int:
    code = code_state()
    import torch

    torch.set_num_threads(threads)
    start = start_model(PRESET, [])
    try:
        cells = load_cells(start)
    except seed_archive.ArchiveError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from flows.prefect_api import serve_prefect_api

    serve_prefect_api()
    from flows.compare.flow import compare

    print(counts_line(cells, seeds), flush=True)
    for seed in seeds:
        t_block = time.time()
        pending = [r for r in RATES if r in REUSE and "reuse" not in cells[r]]
        for rate in sorted(RATES, key=lambda r: (r not in pending, RATES.index(r))):
            archive = cells[rate]
            if str(seed) in archive["seeds"]:
                continue
            t0 = time.time()
            out = compare(preset=PRESET, overrides=[f"run.output_dir={output_dir}", f"train.lr={rate}"], arms=ARMS,
                          seeds=[seed], name=cell_name(rate))
            seed_archive.add_seed(archive, seed, json.loads(Path(out["files"]["json"]).read_text()))
            archive["seeds"][str(seed)]["code"] = code
            if rate in REUSE and seed == CHECK_SEED and "reuse" not in archive:
                check_reuse(archive, rate, start, seeds)
                r = archive["reuse"]
                print(f"reuse check lr {rate} against {r['source']}: "
                      + (f"reproduced bit for bit; imported seeds {r['imported_seeds']}" if r["ok"]
                         else f"not reused ({'; '.join(r.get('differences') or [r.get('why', '')])})"), flush=True)
            seed_archive.save(archive)
            print(f"seed {seed} lr {rate} done in {time.time() - t0:.0f} s", flush=True)
        print(f"seed block {seed} done in {time.time() - t_block:.0f} s; {counts_line(cells, seeds)}", flush=True)
    return 0


def final(seeds: list[int], stopped: str | None) -> int:
    """The pre-registered analysis over the complete seed blocks; refused before all planned seeds are in
    unless `stopped` says why the grid stopped for good."""
    from benchmarks.learning import lr_grid_report

    cells = {r: seed_archive.load_existing(cell_name(r), RESULTS) for r in RATES
             if (RESULTS / f"arith_compare_{cell_name(r)}_seeds.json").exists()}
    complete = [s for s in seeds if len(cells) == len(RATES) and all(str(s) in a["seeds"] for a in cells.values())]
    if len(complete) < len(seeds) and not stopped:
        print(f"error: {len(complete)} of {len(seeds)} planned seed blocks are complete; the pre-registration "
              "allows the analysis only then (or with --stopped REASON when the grid stopped for good)", file=sys.stderr)
        return 2
    if len(complete) < 2:
        print(f"error: {len(complete)} complete seed blocks; the analysis needs at least 2", file=sys.stderr)
        return 2
    result = lr_grid_report.write(cells, RATES, ARMS, complete, planned=len(seeds), stopped=stopped, out=RESULTS)
    save_result("lr_grid_prereg.json", lr_grid_report.finite(result))
    print((RESULTS / "lr_grid_prereg.md").read_text())
    return 0


def merge_worker(folder: Path) -> int:
    """Add the seeds a second worker archived in `folder` (its own worktree at the same commit, run with
    other --seeds) to the cells here. A seed both hold must agree in every held-out value, and the
    settings must be equal; otherwise nothing is written."""
    folder, plans, problems = Path(folder), [], []
    for r in RATES:
        name = cell_name(r)
        if not (folder / f"arith_compare_{name}_seeds.json").exists():
            continue
        other = seed_archive.load_existing(name, folder)
        if (RESULTS / f"arith_compare_{name}_seeds.json").exists():
            here = seed_archive.load_existing(name, RESULTS)
        else:
            here = seed_archive.load(name, other["fingerprint"], RESULTS)
        if here["fingerprint"] != other["fingerprint"]:
            problems.append(f"lr {r}: settings differ ({other['fingerprint']} against {here['fingerprint']})")
            continue
        for s in sorted(set(here["seeds"]) & set(other["seeds"]), key=int):
            diff = heldout_differences(other["seeds"][s], here["seeds"][s])
            if diff:
                problems.append(f"lr {r} seed {s}: {', '.join(diff)}")
        plans.append((r, here, name))
    if problems:
        print(f"error: not merged, the worker's archives disagree with these: {'; '.join(problems)}", file=sys.stderr)
        return 2
    for r, here, name in plans:
        added = seed_archive.merge(here, name, folder)
        if added:
            seed_archive.save(here)
        print(f"lr {r}: merged seeds {added}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default=SEEDS, help="the planned seeds (pre-registered: 0-23)")
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
    try:
        seeds = parse_seed_range(a.seeds)
    except ValueError:
        print(f"error: --seeds must look like 0-23 or 0,1,2 (got {a.seeds!r})", file=sys.stderr)
        return 2
    if a.final:
        return final(seeds, a.stopped)
    if a.status:
        cells = {r: seed_archive.load_existing(cell_name(r)) if (RESULTS / f"arith_compare_{cell_name(r)}_seeds.json")
                 .exists() else {"seeds": {}} for r in RATES}
        print(counts_line(cells, seeds))
        for r, c in cells.items():
            if "reuse" in c:
                print(f"lr {r} reuse: {json.dumps(c['reuse'])}")
        return 0
    return run(seeds, a.output_dir, a.threads)


if __name__ == "__main__":
    raise SystemExit(main())
