"""The SmolLM2 confirmation's learning-rate sweep: held-out curves of the on-policy runs.

    for lr in 2e-6 5e-6 1e-5 2e-5; do
      exgrpo train --config smollm2-evidence --set buffer.replay_ratio=0 --set train.lr=$lr \\
          --set run.seed=100 --set run.steps=30 --set run.name=sm-lr-$lr
    done
    python benchmarks/learning/smollm2_lr.py --runs runs

Reads each `runs/sm-lr-<lr>` run's experience database (held-out pass@1 at every evaluation, fresh
pass@1 per step) and prints one row per rate: held-out pass@1 at each evaluated step, the area under
the held-out curve (the same trapezoid AUC `exgrpo compare` reports) and the last step reached; the
rate with the best AUC over the steps every finished run shares is the pick. Writes
results/smollm2_lr_sweep.json (the table plus every curve). The on-policy arm only, one seed: the
comparison seeds never see this choice.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def run_curve(run_dir: Path) -> dict:
    """Held-out curve [(step, pass@1)], fresh pass@1 per step and the last logged step of one run."""
    from exgrpo_core import metrics as M
    from exgrpo_core.store.experience_store import ExperienceStore, resolve_db_url
    from flows.compare.report import heldout_curve

    store = ExperienceStore(resolve_db_url(None, run_dir))
    try:
        run_id = store.find_run_by_name(run_dir.name)
        if run_id is None:
            raise SystemExit(f"{run_dir}: no run named {run_dir.name} in its database")
        held = heldout_curve(store, run_id)
        fresh = store.get_metrics(run_id, [M.REWARD_MEAN]).get(M.REWARD_MEAN, [])
    finally:
        store.close()
    return {"heldout": held, "fresh": fresh, "last_step": max((s for s, _ in fresh), default=-1)}


def auc(curve: list[tuple[int, float]], upto: int) -> float:
    """Trapezoid area under held-out pass@1 against steps (start = step 0), normalised by the span."""
    from exgrpo_core.evaluation import stats

    pts = [(s + 1, v) for s, v in curve if s <= upto]
    return stats.area_under_curve([x for x, _ in pts], [v for _, v in pts]) if len(pts) > 1 else math.nan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="runs", help="folder holding the sm-lr-<lr> run directories")
    ap.add_argument("--prefix", default="sm-lr-")
    args = ap.parse_args()
    dirs = sorted(Path(args.runs).glob(args.prefix + "*"), key=lambda d: float(d.name[len(args.prefix):]))
    if not dirs:
        raise SystemExit(f"no {args.prefix}* run directories under {args.runs}")
    curves = {d.name[len(args.prefix):]: run_curve(d) for d in dirs}
    done = [c for c in curves.values() if len(c["heldout"]) > 1]  # a run still at its first evaluation waits
    common = min(max(s for s, _ in c["heldout"]) for c in done) if done else -1
    steps = sorted({s for c in done for s, _ in c["heldout"]})
    print(f"held-out pass@1 by evaluated step (-1 = before step 0); AUC over steps -1..{common}, the span every run "
          "with two evaluations has")
    print(f"{'lr':>8} " + " ".join(f"{s:>6}" for s in steps) + f" {'AUC':>6} {'last step':>9}")
    table = {}
    for lr, c in curves.items():
        by = dict(c["heldout"])
        table[lr] = {"auc": auc(c["heldout"], common), "heldout": c["heldout"], "last_step": c["last_step"]}
        print(f"{lr:>8} " + " ".join(f"{by[s]:6.3f}" if s in by else f"{'-':>6}" for s in steps)
              + f" {table[lr]['auc']:6.3f} {c['last_step']:>9}")
    best = max((lr for lr in table if not math.isnan(table[lr]["auc"])), key=lambda lr: table[lr]["auc"], default=None)
    print(f"best AUC: lr {best}" if best else "no run has two evaluations yet")
    from benchmarks.bench_record import save_result

    save_result("smollm2_lr_sweep.json", {"auc_upto_step": common, "best_lr": best, "runs": table,
                                          "fresh_pass1": {lr: c["fresh"] for lr, c in curves.items()}})


if __name__ == "__main__":
    main()
