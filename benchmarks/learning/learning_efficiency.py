"""Learning efficiency: on-policy GRPO (rho = 0) against ExGRPO on cpu-demo, same seeds, data order and
rollout slots per step.

    python benchmarks/learning/learning_efficiency.py                         # 2 seeds x 12 steps, eval every 4
    python benchmarks/learning/learning_efficiency.py --steps 24 --seeds 0,1,2 --name le-long

Runs the comparison flow (`exgrpo compare --arms on_policy,exgrpo`) with periodic held-out evaluation
on the preset's held-out split (cpu-demo: arith-easy-test, 78 questions x `--eval-samples`), then copies
its table and plots to benchmarks/results/learning_efficiency_<name>.* and writes a JSON with the
per-run curves, the command, machine and date. Every child run checkpoints every 2 steps: after an
interruption, rerun the same command and the finished runs are read back, the unfinished one resumes.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.bench_record import RESULTS, save_result  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="cpu-demo")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--eval-every", type=int, default=4)
    ap.add_argument("--eval-samples", type=int, default=2)
    ap.add_argument("--name", default="le-cpu-demo", help="comparison name (child runs resume on it)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="more overrides for both arms")
    a = ap.parse_args()
    from flows.compare.flow import compare

    overrides = [f"run.steps={a.steps}", "run.checkpoint_every=2", f"eval.every={a.eval_every}",
                 f"eval.samples={a.eval_samples}", *a.set]
    out = compare(preset=a.config, overrides=overrides, arms=["on_policy", "exgrpo"],
                  seeds=[int(s) for s in a.seeds.split(",")], name=a.name)
    stem = f"learning_efficiency_{a.name}"
    copied = {}
    for kind, path in out["files"].items():
        if kind in ("md", "csv") or kind.startswith("png_"):
            dest = RESULTS / f"{stem}{'_' + kind[4:] if kind.startswith('png_') else ''}{Path(path).suffix}"
            shutil.copyfile(path, dest)
            copied[kind] = dest.name
    doc = json.loads(Path(out["files"]["json"]).read_text())
    summary = arm_summary(doc["rows"])
    print_table(summary)
    save_result(f"{stem}.json", {"comparison": a.name, "overrides": overrides, "files": copied,
                                 "summary": summary, "rows": doc["rows"], "curves": doc["curves"]})
    return 0


def arm_summary(rows: list[dict]) -> dict[str, dict]:
    """Per arm, from the comparison's `mean` rows: final held-out pass@1, responses, replay, growth."""
    keys = ("heldout_avg", "mean_reward", "final_reward", "responses_generated", "slots_to_target",
            "replayed", "buffer_questions", "retired")
    means = {r["arm"]: r for r in rows if r["seed"] == "mean"} or {r["arm"]: r for r in rows}
    seeds = {}
    for r in rows:
        if r["seed"] != "mean":
            seeds.setdefault(r["arm"], []).append(r.get("heldout_avg"))
    return {arm: {**{k: m.get(k) for k in keys}, "heldout_per_seed": seeds.get(arm, [])} for arm, m in means.items()}


def print_table(summary: dict[str, dict]) -> None:
    print("| arm | held-out pass@1 (per seed) | mean train reward | responses | slots to on-policy final | replayed "
          "| buffer q | retired |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for arm, s in summary.items():
        per = ", ".join("—" if v is None else f"{v:.3f}" for v in s["heldout_per_seed"])
        reach = s["slots_to_target"]
        print(f"| {arm} | {_f(s['heldout_avg'])} ({per}) | {_f(s['mean_reward'])} | {_n(s['responses_generated'])} "
              f"| {'never' if reach is None or (isinstance(reach, float) and math.isnan(reach)) else _n(reach)} "
              f"| {_n(s['replayed'])} | {_n(s['buffer_questions'])} | {_n(s['retired'])} |")


def _f(v) -> str:
    return "—" if v is None else f"{v:.3f}"


def _n(v) -> str:
    return "—" if v is None else f"{v:.0f}"


if __name__ == "__main__":
    raise SystemExit(main())
