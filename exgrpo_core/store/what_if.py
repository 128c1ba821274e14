"""Counterfactual replay: what another selection policy would have replayed from a finished run's stored
pool, step by step, without training (docs/benchmarks/replay_lab.md).

The pool before each step's draw is rebuilt from the database: a question is pooled when it is not
retired yet and has experience (a stored trajectory that entered the pool, `in_pool` or `retired`)
collected at an earlier step; its bucket is the k of its latest earlier group, with the run's
`buffer.zero_success` rule. The rebuilt pool sizes are checked against the run's own
`buffer/questions` metric. The policy's question draw (`selection.sample_questions`) and trajectory
choice (`selection.choose_trajectory`) then run on it; trajectories are chosen by their stored entropy
(at collection: the run chose by the entropy under the policy of the step, which a re-scoring under
that step's checkpoint gives, exgrpo_core/run/rescore.py). Runs with a retired-set review are refused
(their retirement history is not rebuilt).
"""

from __future__ import annotations

import random
from collections import Counter

from sqlalchemy import select

from exgrpo_core import metrics as M
from exgrpo_core.algorithm import age, selection
from exgrpo_core.store.tables import GroupResultRow as G, QuestionState as QS, Replay as R, Trajectory as T


class WhatIfError(ValueError):
    """The run cannot be replayed counterfactually (one line)."""


def read_run(store, run_id: str) -> dict:
    """What the rebuild needs from the database: group history, experiences, retirements, replays."""
    with store.engine.connect() as conn:
        history = conn.execute(select(G.step, G.question_id, G.k, G.is_replay).where(G.run_id == run_id)
                               .order_by(G.step, G.id)).all()
        exp = conn.execute(select(T.id, T.question_id, T.step, T.collected_step, T.entropy).where(
            T.run_id == run_id, (T.in_pool.is_(True)) | (T.retired.is_(True)))).all()
        retired = dict(conn.execute(select(QS.question_id, QS.retired_step).where(
            QS.run_id == run_id, QS.retired.is_(True))).all())
        replays = conn.execute(select(R.step, R.question_id, R.trajectory_id, R.entropy, T.step).join(
            T, T.id == R.trajectory_id).where(R.run_id == run_id).order_by(R.step, R.id)).all()
    return {"history": [tuple(h) for h in history], "experiences": [tuple(e) for e in exp], "retired": retired,
            "replays": [tuple(r) for r in replays]}


def pools(data: dict, keep_bucket_on_zero: bool) -> dict[int, dict[int, list[int]]]:
    """{step t: {bucket k: [question ids]}}: the pool each step's draw saw (after the updates of steps < t)."""
    by_step: dict[int, list] = {}
    for step, qid, k, _ in data["history"]:
        by_step.setdefault(step, []).append((qid, k))
    first_exp: dict[int, int] = {}
    for _, qid, _, collected, _ in data["experiences"]:
        first_exp[qid] = min(first_exp.get(qid, collected), collected)
    latest: dict[int, int] = {}
    out: dict[int, dict[int, list[int]]] = {}
    last = max(by_step, default=-1)
    for t in range(last + 2):
        out[t] = {}
        for qid, k in latest.items():
            if qid in first_exp and first_exp[qid] < t and not (qid in data["retired"] and data["retired"][qid] < t):
                out[t].setdefault(k, []).append(qid)
        for qid, k in by_step.get(t, []):
            pooled = qid in first_exp and first_exp[qid] < t and not (
                qid in data["retired"] and data["retired"][qid] < t)
            latest[qid] = latest.get(qid, k) if keep_bucket_on_zero and k == 0 and pooled else k
        for members in out[t].values():
            members.sort()
    return out


def replay(data: dict, pool: dict[int, dict[int, list[int]]], steps: list[int], n: int, weights: dict[int, float],
           per_question: bool, trajectory: str, seed: int, max_age: int | None = None,
           half_life: float | None = None) -> list[dict]:
    """The policy's draws at each step of `steps`: [{step, questions, buckets, ages, entropies, trajectories}]
    (trajectories: the chosen id of each question, None where it had none to choose); with `max_age` /
    `half_life` under the age rules (algorithm/age.py), as the loop draws then."""
    rng = random.Random(seed)
    cands = candidates(data)
    out = []
    for t in steps:
        buckets = pool.get(t, {})
        bucket_of = {q: k for k, qs in buckets.items() for q in qs}
        if max_age is None and half_life is None:
            drawn = selection.sample_questions(buckets, n, weights, rng, per_question)
        else:
            newest = {q: max((c[2] for c in cands.get(q, []) if c[0] < t), default=None) for qs in buckets.values()
                      for q in qs}
            aged = {k: [(q, t - newest[q]) for q in qs if newest[q] is not None] for k, qs in buckets.items()}
            drawn = age.sample_aged_questions(aged, n, weights, rng, per_question, max_age, half_life)
        ages, ents, tids = [], [], []
        for q in drawn:
            options = options_at(cands, q, t, max_age)
            if options:
                i = selection.choose_trajectory([c[3] for c in options], trajectory, rng)
                ages.append(t - options[i][2])
                ents.append(options[i][3])
            tids.append(options[i][1] if options else None)
        out.append({"step": t, "questions": drawn, "buckets": [bucket_of[q] for q in drawn], "ages": ages,
                    "entropies": ents, "trajectories": tids})
    return out


def candidates(data: dict) -> dict[int, list[tuple]]:
    """{question id: [(collected step, trajectory id, sampled step, stored entropy)]} of the run's experiences."""
    cands: dict[int, list] = {}
    for tid, qid, step, collected, entropy in data["experiences"]:
        cands.setdefault(qid, []).append((collected, tid, step, entropy))
    return cands


def options_at(cands: dict[int, list[tuple]], q: int, t: int, max_age: int | None = None) -> list[tuple]:
    """The stored trajectories of question `q` a draw at step `t` chooses from (`candidates` entries):
    collected before t, with an entropy, young enough under `max_age`."""
    return [c for c in cands.get(q, []) if c[0] < t and c[3] is not None and age.young_enough(t - c[2], max_age)]


def actual(data: dict) -> list[dict]:
    """What the run replayed, per step, in the same shape (entropy: under the policy at replay time)."""
    last: dict[int, int] = {}
    drawn: dict[int, list[int]] = {}
    for step, qid, k, is_replay in data["history"]:
        if is_replay:
            drawn.setdefault(step, []).append(last.get(qid))
        last[qid] = k
    per: dict[int, dict] = {}
    for step, qid, tid, entropy, sampled in data["replays"]:
        d = per.setdefault(step, {"step": step, "questions": [], "ages": [], "entropies": [], "trajectories": []})
        d["questions"].append(qid)
        d["trajectories"].append(tid)
        d["ages"].append(step - sampled)
        if entropy is not None:
            d["entropies"].append(entropy)
    for step, ks in drawn.items():
        per.setdefault(step, {"step": step, "questions": [], "ages": [], "entropies": [], "trajectories": []})[
            "buckets"] = ks
    return [{**per[s], "buckets": per[s].get("buckets", [])} for s in sorted(per)]


def summary(draws: list[dict], weights: dict[int, float]) -> dict:
    """Shares by source bucket (with the normalised target), mean age and entropy, distinct questions."""
    ks = [k for d in draws for k in d["buckets"] if k is not None]
    total = sum(weights.values()) or 1.0
    ages = [a for d in draws for a in d["ages"]]
    ents = [e for d in draws for e in d["entropies"]]
    return {"replays": len(ks), "share": {k: n / len(ks) for k, n in sorted(Counter(ks).items())} if ks else {},
            "target": {k: w / total for k, w in weights.items()},
            "age_mean": sum(ages) / len(ages) if ages else 0.0, "entropy_mean": sum(ents) / len(ents) if ents else 0.0,
            "distinct_questions": len({q for d in draws for q in d["questions"]})}


def what_if(store, run_id: str, cfg, seed: int = 0) -> dict:
    """The counterfactual of policy `cfg` (an ExGRPOConfig: its selection and replay ratio) on run `run_id`
    beside what the run did; raises WhatIfError when the run cannot be rebuilt."""
    row = store.get_run(run_id)
    buf = row["config"].get("buffer", {})
    if buf.get("review_retired_every"):
        raise WhatIfError(f"run {row['name']} reviewed its retired set (buffer.review_retired_every): its retirement "
                          "history is not rebuilt, so a counterfactual would be wrong")
    data = read_run(store, run_id)
    pool = pools(data, buf.get("zero_success", "keep_bucket") == "keep_bucket")
    logged = dict(store.get_metrics(run_id, [M.BUFFER_QUESTIONS]).get(M.BUFFER_QUESTIONS, []))
    rebuilt = {t - 1: sum(len(v) for v in pool.get(t, {}).values()) for t in range(1, max(pool, default=0) + 1)}
    wrong = {s: (rebuilt.get(s), v) for s, v in logged.items() if rebuilt.get(s) != int(v)}
    if wrong:
        s, (got, want) = min(wrong.items())
        raise WhatIfError(f"the rebuilt pool of run {row['name']} after step {M.step_number(s)} has {got} questions, "
                          f"the run logged {int(want)}: its history is incomplete")
    start = row.get("replay_started_step")
    steps = [] if start is None else [t for t in range(start + 1, row["step"] + 1)]
    sel = cfg.selection
    weights = selection.bucket_weights(cfg.rollout.group_size, sel.question_weighting, sel.sigma, sel.sigma_unit,
                                       sel.mu, top=cfg.reward.continuous)
    draws = replay(data, pool, steps, cfg.replay_questions, weights, sel.question_weighting in selection.PER_QUESTION,
                   sel.trajectory, seed, cfg.buffer.max_age, sel.age_half_life)
    return {"run_id": run_id, "steps": [M.step_number(t) for t in steps[:1] + steps[-1:]],
            "what_if": summary(draws, weights), "actual": summary(actual(data), weights), "per_step": draws}
