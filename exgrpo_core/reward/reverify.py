"""`exgrpo reverify`: grade a run's stored trajectories again with the current verifier and report
where the stored reward disagrees (docs/audit.md). Reads only, unless `apply` is asked:
then the disagreeing rewards change in one transaction, each change recorded (`reward_changes`).

Each row is graded as training grades it (`audit.grade_and_describe`, with the run's own
reward settings: timeout, `require_think`, the truncation rule), by the grader recorded for it
(else its question's: `rewards.grader_for`), or by the one grader `--verifier` names.
"""

from __future__ import annotations

from collections import Counter

from exgrpo_core.reward import audit
from exgrpo_core.reward.audit import apply_truncation_rule
from exgrpo_core.reward.grading import MathVerifier
from exgrpo_core.store.engine import mask_url
from exgrpo_core.store.experience_store import ExperienceStore, StoreError
from exgrpo_core.types import Question, Rollout


def find_run(store: ExperienceStore, run: str) -> str:
    """The id of the run named or numbered `run` (its newest of that name); StoreError names it otherwise."""
    if store.get_run(run):
        return run
    found = store.find_run_by_name(run)
    if found is None:
        raise StoreError(f"no run {run!r} (by name or id) in the experience database at {mask_url(store.url)}")
    return found


def regrade(rows: list[dict], verify, *, grader: str = "auto", require_think: bool = False,
            truncated: str = "grade") -> list[Rollout]:
    """Stored rows (`ExperienceStore.stored_trajectories`) graded now, as rollouts with audit fields."""
    rollouts = [Rollout(r["uid"], [], [], [], r["text"], bool(r["truncated"]), r["step"]) for r in rows]
    questions = [Question(r["uid"], (), r["answer"], r["source"], r["verifier"] or "") for r in rows]
    audit.grade_and_describe(verify, rollouts, questions, require_think=require_think, grader=grader)
    apply_truncation_rule(rollouts, truncated)
    return rollouts


def reverify(store: ExperienceStore, run: str, *, grader: str = "auto", apply: bool = False,
             verify=None) -> dict:
    """Regrade run `run` (name or id) and return {"run_id", "summary", "disagreements", "applied"}.

    `verify`: the math verifier to use (default: a MathVerifier with the run's reward.timeout_s and
    require_think, closed afterwards). Disagreement: stored reward != the new one.
    """
    run_id = find_run(store, run)
    cfg = store.get_run(run_id)["config"].get("reward", {})
    if grader == "auto" and (cfg.get("fn") or cfg.get("url")):  # the rows' own dataset fields are not stored
        source = f"reward.fn={cfg['fn']}" if cfg.get("fn") else "reward.url"
        raise StoreError(f"run {run} was graded by {source}: reverify regrades math-verify and choice grades only "
                         "(pass --verifier math or --verifier choice to grade its trajectories that way)")
    rows = store.stored_trajectories(run_id)
    verifier = None
    if verify is None:
        verifier = MathVerifier(cfg.get("timeout_s", 5.0), cfg.get("require_think", False), cfg.get("workers", 1))
        verify = verifier.verify
    try:
        graded = regrade(rows, verify, grader=grader, require_think=cfg.get("require_think", False),
                         truncated=cfg.get("truncated", "grade"))
    finally:
        if verifier is not None:
            verifier.close()
    out, changes = [], []
    for row, r in zip(rows, graded):
        if float(row["reward"]) == r.reward:
            continue
        out.append({"trajectory_id": row["id"], "question": row["uid"], "step": row["step"],
                    "stored_reward": float(row["reward"]), "new_reward": r.reward,
                    "stored_verifier": row["verifier_version"] and f"{row['verifier']} {row['verifier_version']}",
                    "verifier": f"{r.verifier} {r.verifier_version}", "prediction": r.prediction, "gold": r.gold,
                    "reason": r.reason, "stored_prediction": row["prediction"], "in_pool": bool(row["in_pool"])})
        changes.append({"id": row["id"], "old": float(row["reward"]), "new": r.reward, "prediction": r.prediction,
                        "gold": r.gold, "verifier": r.verifier, "verifier_version": r.verifier_version,
                        "verify_timed_out": r.reason == "timeout", "verify_reason": r.reason[:16]})
    summary = {"trajectories": len(rows), "agree": len(rows) - len(out), "disagree": len(out),
               "now_correct": sum(d["new_reward"] > d["stored_reward"] for d in out),
               "now_wrong": sum(d["new_reward"] < d["stored_reward"] for d in out),
               "timeouts": sum(r.reason == "timeout" for r in graded),
               "stored_versions": dict(Counter(str(r["verifier_version"]) for r in rows)),
               "current_versions": dict(Counter(r.verifier_version for r in graded))}
    applied = store.apply_reward_changes(run_id, changes) if apply and changes else None
    return {"run_id": run_id, "grader": grader, "summary": summary, "disagreements": out, "applied": applied}
