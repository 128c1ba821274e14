"""On-policy GRPO, ExGRPO and the paper's ablations on the arith-fast task, many paired seeds,
resumable (issue 15, part 3).

    python benchmarks/arith_compare.py --arms on_policy,exgrpo --seeds 0-15 --name af-main
    python benchmarks/arith_compare.py --arms all-paper --seeds 0-15 --name af-ablations
    nohup nice -n 19 python benchmarks/arith_compare.py ... > runs/af-main.log 2>&1 &   # in the background

Seeds run one at a time, every arm of a seed before the next seed (the compare flow is seed-major), so
stopping it at any moment leaves complete seed pairs plus at most one partial seed. After every seed
the comparison report of the complete seeds so far (table, paired statistics against on_policy with
95% intervals, replays by source bucket, plots) is copied to benchmarks/results/arith_compare_<name>.*
with the seed count. Rerun the same command to resume: finished child runs are read back from
their databases, an interrupted one resumes from its last checkpoint. One torch thread per process.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from bench_record import RESULTS, save_result  # noqa: E402

# The paper's ablations besides no_selection, which the paper lists as a combination.
PAPER_ARMS = ["on_policy", "exgrpo", "no_question_selection", "no_trajectory_selection", "highest_entropy",
              "no_policy_shaping", "rho_0.25", "rho_0.75"]


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
    ap.add_argument("--output-dir", default=str(HERE.parent / "runs"))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="more overrides for every arm")
    a = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    from flows.compare import compare

    arms = PAPER_ARMS if a.arms == "all-paper" else [x.strip() for x in a.arms.split(",")]
    seeds = parse_seed_range(a.seeds)
    overrides = [f"run.output_dir={a.output_dir}", *([f"run.steps={a.steps}"] if a.steps else []), *a.set]
    done: list[int] = []
    for seed in seeds:
        t0 = time.time()
        out = compare(preset=a.config, overrides=overrides, arms=arms, seeds=[*done, seed], name=a.name)
        done.append(seed)
        copied = publish(out, a.name)
        save_result(f"arith_compare_{a.name}.json", {
            "comparison": a.name, "preset": a.config, "arms": arms, "seeds_done": done, "seeds_planned": seeds,
            "overrides": overrides, "files": copied, "last_seed_seconds": time.time() - t0,
            "report_json": out["files"]["json"]})
        print(f"seed {seed} done ({len(done)}/{len(seeds)}) in {time.time() - t0:.0f} s", flush=True)
    return 0


def publish(out: dict, name: str) -> dict[str, str]:
    """Copy the comparison's Markdown, CSV, full JSON and plots to benchmarks/results/arith_compare_<name>*."""
    stem = f"arith_compare_{name}"
    copied = {}
    for kind, path in out["files"].items():
        suffix = f"_{kind[4:]}" if kind.startswith("png_") else "_report" if kind == "json" else ""
        dest = RESULTS / f"{stem}{suffix}{Path(path).suffix}"
        shutil.copyfile(path, dest)
        copied[kind] = dest.name
    return copied


if __name__ == "__main__":
    raise SystemExit(main())
