"""The replay lab's pilot gate: can question selection act on this task at this rate?

For one ExGRPO run (by name or id) it reads, over steps `--from`..`--to` (1-based, inclusive):
- the mean number of questions in buckets k = 3, 4, 5 (questions whose latest group had k of K = 8
  correct: `buffer/bucket_k`, logged every step), and
- the share of replays drawn from k = 3..5 (each experiential group's question's bucket before that
  step, as `ExperienceStore.replay_buckets`), beside the Gaussian's target share.
It passes when every one of k = 3, 4, 5 holds >= `--min-questions` (8) on average and >= `--min-share`
(70%) of replays come from them. Prints a table; with --out writes the JSON record.

    python benchmarks/learning/pilot_gate.py --db sqlite:///runs/pilot.db --run pilot-exgrpo-s0
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

MEDIUM = (3, 4, 5)


def gate(buckets: dict[int, list[tuple[int, float]]], history: list[tuple[int, int, int, bool]], lo: int, hi: int,
         weights: dict[int, float], min_questions: float = 8, min_share: float = 0.7) -> dict:
    """The gate's numbers from a run's per-step bucket counts {k: [(step, n)]} (0-based steps) and its group
    history [(step, question_id, k, is_replay)] in order; `lo`..`hi` are 1-based step numbers."""
    mean = {}
    for k in MEDIUM:
        vals = [v for step, v in buckets.get(k, []) if lo <= step + 1 <= hi]
        mean[k] = sum(vals) / len(vals) if vals else 0.0
    last: dict[int, int] = {}
    drawn: dict[int, int] = {}
    for step, qid, k, is_replay in history:
        if is_replay and qid in last and lo <= step + 1 <= hi:
            drawn[last[qid]] = drawn.get(last[qid], 0) + 1
        last[qid] = k
    total = sum(drawn.values())
    share = sum(drawn.get(k, 0) for k in MEDIUM) / total if total else 0.0
    target = sum(weights.get(k, 0.0) for k in MEDIUM) / (sum(weights.values()) or 1.0)
    ok = all(mean[k] >= min_questions for k in MEDIUM) and share >= min_share
    return {"steps": [lo, hi], "mean_questions": mean, "replays": total, "replays_by_bucket": dict(sorted(drawn.items())),
            "medium_share": share, "target_share": target, "passes": ok,
            "rule": f"each of k=3,4,5 >= {min_questions:g} questions on average and >= {100 * min_share:.0f}% of "
                    "replays from k=3..5"}


def main() -> int:
    from sqlalchemy import select

    from exgrpo_core import metrics as M
    from exgrpo_core.algorithm.selection import bucket_weights
    from exgrpo_core.config.schema import SelectionConfig
    from exgrpo_core.reward.reverify import find_run
    from exgrpo_core.store.experience_store import ExperienceStore
    from exgrpo_core.store.tables import GroupResultRow as G

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--run", required=True)
    ap.add_argument("--from", dest="lo", type=int, default=20)
    ap.add_argument("--to", dest="hi", type=int, default=150)
    ap.add_argument("--min-questions", type=float, default=8)
    ap.add_argument("--min-share", type=float, default=0.7)
    ap.add_argument("--out")
    a = ap.parse_args()
    with ExperienceStore(a.db) as store:
        run_id = find_run(store, a.run)
        row = store.get_run(run_id)
        K = int(row["group_size"])
        m = store.get_metrics(run_id, [M.bucket_key(k) for k in MEDIUM])
        with store.engine.connect() as conn:
            history = conn.execute(select(G.step, G.question_id, G.k, G.is_replay).where(G.run_id == run_id)
                                   .order_by(G.step, G.id)).all()
    sel = SelectionConfig.model_validate(row["config"].get("selection", {}))
    weights = bucket_weights(K, sel.question_weighting, sel.sigma, sel.sigma_unit, sel.mu)
    out = gate({k: m.get(M.bucket_key(k), []) for k in MEDIUM}, [tuple(h) for h in history], a.lo, a.hi, weights,
               a.min_questions, a.min_share)
    print(f"pilot gate, run {a.run}, steps {a.lo}-{a.hi} ({out['rule']})")
    print("| k | mean questions |\n|---|---|")
    for k in MEDIUM:
        print(f"| {k} | {out['mean_questions'][k]:.1f} |")
    print(f"replays from k=3..5: {100 * out['medium_share']:.0f}% of {out['replays']} "
          f"(Gaussian target {100 * out['target_share']:.0f}%)  ->  {'PASS' if out['passes'] else 'FAIL'}")
    if a.out:
        from benchmarks.bench_record import write_json
        write_json(a.out, {"command": "python " + " ".join(sys.argv), "run": a.run, **out})
    return 0


if __name__ == "__main__":
    sys.exit(main())
