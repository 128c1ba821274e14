"""On-policy GRPO, ExGRPO and the paper's ablations on the arith-fast task, many paired seeds,
resumable.

    python benchmarks/learning/arith_compare.py --arms on_policy,exgrpo --seeds 0-15 --name af-main
    python benchmarks/learning/arith_compare.py --arms all-paper --seeds 0-15 --name af-ablations
    nohup nice -n 19 python benchmarks/learning/arith_compare.py ... > runs/af-main.log 2>&1 &   # in the background

Seeds run one at a time, every arm of a seed before the next seed (the compare flow is seed-major), so
stopping it at any moment leaves complete seed pairs plus at most one partial seed. After every seed
the comparison report of the complete seeds so far (table, paired statistics against on_policy with
95% intervals, replays by source bucket, plots) is copied to benchmarks/results/arith_compare_<name>.*
with the seed count. Rerun the same command to resume: finished child runs are read back from
their databases, an interrupted one resumes from its last checkpoint. One torch thread per process (`--threads`).

Each finished seed (every arm's row, curves and per-question results) is archived in
results/arith_compare_<name>_seeds.json with the commit it trained on, and the published report is
rebuilt from the archive: a later session (a fresh checkout without the runs/ folder) runs only the
seeds the archive lacks. The archive remembers the preset, arms and overrides; other settings under
the same name are refused (use another --name).

Two workers on a 2-core machine: run the second under another name on other seeds, then fold its
archive in (same settings required) and republish:

    python benchmarks/learning/arith_compare.py --arms all-paper --seeds 9-15 --name af-ablations-w2
    python benchmarks/learning/arith_compare.py --arms all-paper --seeds 0-15 --name af-ablations --merge-from af-ablations-w2
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_record import RESULTS, save_result, write_json  # noqa: E402
from benchmarks.learning import seed_archive  # noqa: E402

# The paper's ablations besides no_selection, which the paper lists as a combination.
PAPER_ARMS = ["on_policy", "exgrpo", "no_question_selection", "no_trajectory_selection", "highest_entropy",
              "no_policy_shaping", "rho_0.25", "rho_0.75"]


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 (got {n})")
    return n


def parse_seed_range(text: str) -> list[int]:
    """"0-3,7" -> [0, 1, 2, 3, 7]."""
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        out += list(range(int(lo), int(hi) + 1)) if hi else [int(lo)]
    return list(dict.fromkeys(out))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="arith-fast")
    ap.add_argument("--arms", default="on_policy,exgrpo", help="comma list, or all-paper")
    ap.add_argument("--seeds", default="0-15", help="e.g. 0-15 or 0,1,2")
    ap.add_argument("--steps", type=int, default=None, help="run.steps (default: the preset's)")
    ap.add_argument("--name", default="af-main", help="comparison name (child runs resume on it)")
    ap.add_argument("--threads", type=positive_int, default=1, help="torch threads (the SmolLM2 preset: 2)")
    ap.add_argument("--output-dir", default=str(ROOT / "runs"))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="more overrides for every arm")
    ap.add_argument("--import-report", default=None, metavar="JSON",
                    help="archive the seeds of an earlier comparison report (flows' compare_<name>.json) first")
    ap.add_argument("--import-commit", default="unknown", help="the commit that report's runs trained on")
    ap.add_argument("--merge-from", action="append", default=[], metavar="NAME",
                    help="first add the seeds of another worker's archive (same settings, other --name)")
    ap.add_argument("--republish", action="store_true",
                    help="only rebuild the published report of --name from its archive (no training; the archive's "
                         "own settings, whatever the preset now builds): after a change to the report's statistics")
    a = ap.parse_args()
    if a.republish:
        try:
            archive = seed_archive.load_existing(a.name)
        except seed_archive.ArchiveError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        publish(archive, a.name, published_output_dir(a.name) or a.output_dir, republished=True)
        print(f"{a.name}: report rebuilt from {len(archive['seeds'])} archived seeds", flush=True)
        return 0
    import torch

    torch.set_num_threads(a.threads)

    arms = PAPER_ARMS if a.arms == "all-paper" else [x.strip() for x in a.arms.split(",")]
    seeds = parse_seed_range(a.seeds)
    extra = [*([f"run.steps={a.steps}"] if a.steps else []), *a.set]
    fingerprint = {"preset": a.config, "arms": arms, "overrides": extra, "start_model": start_model(a.config, extra)}
    try:
        archive = seed_archive.load(a.name, fingerprint)
    except seed_archive.ArchiveError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.import_report:
        seed_archive.import_report(archive, Path(a.import_report), a.import_commit)
        seed_archive.save(archive)
    for other in a.merge_from:
        try:
            added = seed_archive.merge(archive, other)
        except seed_archive.ArchiveError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        seed_archive.save(archive)
        print(f"merged seeds {added} from {other}", flush=True)
    from flows.prefect_api import serve_prefect_api

    serve_prefect_api()  # after the checks above; unless PREFECT_API_URL is set, a Prefect API that dies with this driver
    from flows.compare.flow import compare

    overrides = [f"run.output_dir={a.output_dir}", *extra]
    for seed in [s for s in seeds if str(s) not in archive["seeds"]]:
        t0 = time.time()
        out = compare(preset=a.config, overrides=overrides, arms=arms, seeds=[seed], name=a.name)
        seed_archive.add_seed(archive, seed, json.loads(Path(out["files"]["json"]).read_text()))
        seed_archive.save(archive)
        publish(archive, a.name, a.output_dir)
        print(f"seed {seed} done ({len(archive['seeds'])} archived) in {time.time() - t0:.0f} s", flush=True)
    publish(archive, a.name, a.output_dir)
    return 0


def start_model(preset: str, overrides: list[str]) -> str:
    """The starting model's identity: SHA-256 of the warm-started weights for `tiny-sft` (built now if
    not cached; one thread, so every machine with this torch build gets the same), else its name."""
    from exgrpo_core.config.load import load_config
    from exgrpo_core.models import warm_start
    from exgrpo_core.models.load import TINY_SFT

    m = load_config(preset, overrides).model
    if m.name_or_path != TINY_SFT:
        return m.name_or_path
    return "tiny-sft sha256:" + warm_start.weights_sha256(
        warm_start.warm_started(m.tiny.model_dump(), m.warm_start.model_dump()))


def published_output_dir(name: str) -> str | None:
    """The run.output_dir the published report of `name` names (where its runs were), if any."""
    p = RESULTS / f"arith_compare_{name}_report.json"
    overrides = json.loads(p.read_text()).get("overrides", []) if p.exists() else []
    return next((o.split("=", 1)[1] for o in overrides if o.startswith("run.output_dir=")), None)


def publish(archive: dict, name: str, output_dir: str, republished: bool = False) -> None:
    """Rebuild the report over every archived seed; copy it to benchmarks/results/arith_compare_<name>*.
    `republished`: the runs are older than the report code; the summary says so (earlier such notes kept)."""
    from exgrpo_core.config.load import load_config
    from flows.compare import report as compare_report
    from flows.compare.arms import build_arm_runs
    from flows.compare.flow import _meta

    fp, done = archive["fingerprint"], sorted(archive["seeds"], key=int)
    if not done:
        return
    overrides = [f"run.output_dir={output_dir}", *fp["overrides"]]
    model_note = f"Starting model: {fp['start_model']}."
    runs = build_arm_runs(fp["preset"], overrides, fp["arms"], [int(s) for s in done], name, True)
    base = load_config(fp["preset"], [*overrides, f"run.name={name}"])
    meta = _meta(base, fp["preset"], overrides, fp["arms"], [int(s) for s in done], name, True, runs)
    commits = sorted({archive["seeds"][s]["commit"] for s in done})
    meta["notes"] = [f"Driver: `python benchmarks/learning/arith_compare.py --config {fp['preset']} --arms {','.join(fp['arms'])} "
                     f"--name {name}" + "".join(f" --set {o}" for o in fp["overrides"]) + "` (seed by seed; "
                     f"{len(done)} seeds archived in `arith_compare_{name}_seeds.json`, trained on commit(s) "
                     f"{', '.join(commits)}). {model_note}", "", *meta["notes"]]
    with tempfile.TemporaryDirectory() as tmp:
        paths = compare_report.write_report(seed_archive.results(archive), Path(tmp), name, meta)
        for kind, path in paths.items():
            suffix = f"_{kind[4:]}" if kind.startswith("png_") else "_report" if kind == "json" else ""
            shutil.copyfile(path, RESULTS / f"arith_compare_{name}{suffix}{Path(path).suffix}")
    summary = RESULTS / f"arith_compare_{name}.json"
    old = json.loads(summary.read_text()) if summary.exists() else {}
    record = {"comparison": name, **fp, "seeds_done": [int(s) for s in done], "commits": commits,
              **{k: old[k] for k in ("relabelled", "republished") if k in old}}
    if not (republished and old):
        save_result(summary.name, record)
        return
    record["republished"] = (f"{datetime.date.today().isoformat()}: report rebuilt from the seed archive by the code "
                             f"of commit {seed_archive.commit()} (`python {' '.join(sys.argv)}`); the runs are unchanged")
    write_json(summary, {**old, **record}, default=float)  # the runs' provenance stays


if __name__ == "__main__":
    raise SystemExit(main())
