"""Re-scoring a replay what-if's trajectories under a checkpoint (`exgrpo replay-what-if --rescore`,
exgrpo_core/store/what_if.py).

The trajectories the run replayed and those the policy would have replayed are scored by the trainer's
own pass (`policy.token_logprobs_and_entropy`, at the run's rollout temperature) under the weights of a
checkpoint: how far that policy has moved from the one that sampled them (log pi / pi_behaviour against
the stored behaviour log-probs), the weight the replay loss would give their tokens (`losses`, paper
Eq. 6), their entropy H(o) under it beside the stored one, and whether the lowest-entropy trajectory of
each drawn question would change. Checks that read no weights come first (`check_source`).
"""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path
from typing import Callable

import torch
from sqlalchemy import select

from exgrpo_core import metrics as M
from exgrpo_core.algorithm import losses, selection
from exgrpo_core.data import questions as data
from exgrpo_core.models import load as models
from exgrpo_core.models.build import build_tiny_tokenizer
from exgrpo_core.models.check import check_model_source
from exgrpo_core.run import checkpoint as C
from exgrpo_core.store import codec
from exgrpo_core.store import what_if as W
from exgrpo_core.store.tables import QuestionRow, QuestionState as QS, Trajectory as T
from exgrpo_core.training import policy
from exgrpo_core.training.batch import collate
from exgrpo_core.types import Question, Rollout

ARMS = ("what_if", "actual")  # the report's sides, as `what_if.what_if` names them
SHAPE = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")


class RescoreError(ValueError):
    """The checkpoint cannot score this run's trajectories (one line)."""


def resolve(checkpoint: str, run_dir: Path) -> str:
    """A model name the loaders know (tiny, a hub name), a model / checkpoint folder, or `step_N` of the run."""
    if re.fullmatch(r"step_\d+", checkpoint) and not Path(checkpoint).exists():
        return str((C.checkpoint_dir(run_dir) / f"step_{int(checkpoint[5:]):06d}").resolve())
    return checkpoint


def _shape(source: str, run_cfg) -> dict | None:
    config = models.policy_config(source, tiny=run_cfg.model.tiny.model_dump(), hf_overrides=run_cfg.model.hf_overrides)
    return None if config is None else {k: getattr(config, k, None) for k in SHAPE}


def _tokenizer(source: str):
    if source in (models.TINY, models.TINY_SFT):
        return build_tiny_tokenizer()
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(Path(source).expanduser()))
    except (OSError, ValueError):
        return None


def check_source(source: str, run_cfg) -> dict:
    """One RescoreError line, before any weight is read, when `source` cannot score the run's trajectories: a
    missing or incomplete folder, another architecture or another tokenizer than the run's model. Returns
    {checkpoint, step (its step number, None for a bare model), run_id (of a run checkpoint)}."""
    try:
        check_model_source(source, run_cfg.model.tiny.model_dump())
    except models.ModelLoadError as e:
        raise RescoreError(f"--rescore {source}: {e}") from None
    mine, theirs = _shape(source, run_cfg), _shape(run_cfg.model.name_or_path, run_cfg)
    if mine and theirs and mine != theirs:
        k = next(k for k in SHAPE if mine[k] != theirs[k])
        raise RescoreError(f"--rescore {source} is another model than the run's ({run_cfg.model.name_or_path}): "
                           f"{k} {mine[k]} against {theirs[k]}")
    tok, own = _tokenizer(source), _tokenizer(run_cfg.model.name_or_path)
    if tok is not None and own is not None and tok.get_vocab() != own.get_vocab():
        raise RescoreError(f"--rescore {source} has another tokenizer than the run's model "
                           f"({run_cfg.model.name_or_path}): the stored token ids would mean other text")
    state = Path(source).expanduser() / C.STATE_FILE
    loop = C.load_trainer_state(state.parent) if state.is_file() else None
    return {"checkpoint": source, "step": None if loop is None else M.step_number(loop["step"]),
            "run_id": None if loop is None else loop["loop"].get("run_id")}


def load(source: str, run_cfg):
    """(model, tokenizer) of `source`, as the run's session loads its policy (its tiny shape, seed, warm start)."""
    model, tok = models.load_policy(source, dtype=run_cfg.model.dtype, tiny=run_cfg.model.tiny.model_dump(),
                                    seed=run_cfg.run.seed, warm_start=run_cfg.model.warm_start.model_dump(),
                                    hf_overrides=run_cfg.model.hf_overrides)
    return model.eval(), tok


def _parts(ids: set[int], n: int = 500) -> list[list[int]]:
    """Ids in slices of `n`: an IN list within SQLite's bound-parameter limit."""
    ids = sorted(ids)
    return [ids[i:i + n] for i in range(0, len(ids), n)]


def read_trajectories(store, run_id: str, ids: set[int]) -> dict[int, dict]:
    """{id: question_id, uid, step, response ids, behaviour log-probs, stored entropy} of these trajectories."""
    out, query = {}, (select(T.id, T.question_id, QS.uid, T.step, T.token_ids, T.behaviour_logprobs, T.entropy)
                      .join(QS, (QS.run_id == T.run_id) & (QS.question_id == T.question_id)).where(T.run_id == run_id))
    with store.engine.connect() as conn:
        rows = [r for part in _parts(ids) for r in conn.execute(query.where(T.id.in_(part))).all()]
    for tid, qid, uid, step, ids_blob, lp_blob, ent in rows:
        out[tid] = {"question_id": qid, "uid": uid, "step": step, "response_ids": codec.decode_token_ids(ids_blob),
                    "behaviour": codec.decode_logprobs(lp_blob), "stored_entropy": ent}
    return out


def prompts(store, run_cfg, tokenizer, qids: set[int]) -> dict[int, list[int]]:
    """The prompt token ids of these questions as the run built them: the stored chat messages through the
    chat template, or (a raw data.prompt_template) the questions loaded again from the run's data."""
    d = run_cfg.data
    query = select(QuestionRow.id, QuestionRow.uid, QuestionRow.messages_json)
    with store.engine.connect() as conn:
        rows = [r for part in _parts(qids) for r in conn.execute(query.where(QuestionRow.id.in_(part))).all()]
    if d.prompt_template == data.CHAT:
        qs = {qid: Question(uid, tuple(json.loads(m)), "") for qid, uid, m in rows}
    else:
        loaded = {q.uid: q for q in data.load_questions(
            d.train_path, question_key=d.question_key, answer_key=d.answer_key, system_prompt=d.system_prompt,
            instruction=d.instruction, max_questions=d.max_questions, prompt_template=d.prompt_template)}
        qs = {qid: loaded[uid] for qid, uid, _ in rows if uid in loaded}
    return {qid: data.prompt_token_ids(tokenizer, q, run_cfg.rollout.max_prompt_tokens) for qid, q in qs.items()}


@torch.no_grad()
def score(model, rows: dict[int, dict], prompt_ids: dict[int, list[int]], pad_id: int, *, micro_batch_size: int,
          temperature: float, progress: Callable[[int, int], None] | None = None) -> dict[int, tuple[list, float]]:
    """{id: (token log-probs [T], H(o))} under `model`: the trainer's scoring pass, in micro batches,
    `micro_batch_size` * 8 rows a call (progress(done, total) after each)."""
    device = next(model.parameters()).device
    todo = sorted(rows, key=lambda t: len(prompt_ids[rows[t]["question_id"]]) + len(rows[t]["response_ids"]))
    out, chunk = {}, micro_batch_size * 8
    for s in range(0, len(todo), chunk):
        ids = todo[s:s + chunk]
        batch = collate([Rollout("", prompt_ids[rows[t]["question_id"]], rows[t]["response_ids"], rows[t]["behaviour"],
                                 "", False, rows[t]["step"]) for t in ids], [0.0] * len(ids), pad_id)
        logp, ent = policy.token_logprobs_and_entropy(
            model, batch.input_ids.to(device), batch.attention_mask.to(device), micro_batch_size=micro_batch_size,
            temperature=temperature, score_mask=batch.response_mask)
        mask = batch.response_mask.to(logp.device)
        h = policy.trajectory_entropy(ent, mask)
        for i, t in enumerate(ids):
            out[t] = (logp[i][mask[i]].double().cpu().tolist(), float(h[i]))
        if progress:
            progress(len(out), len(todo))
    return out


def trajectory_stats(logp: list[float], behaviour: list[float], beta: float | None) -> dict:
    """Sequence log-ratio sum_t log pi/pi_behaviour, its token mean, and the mean over tokens of the replay
    loss's weight: f(w) = w / (w + beta) with policy shaping (paper Eq. 6), the plain w with beta None (the
    loss's own terms, its log-ratio clamp included)."""
    cur = torch.tensor(logp or [0.0], dtype=torch.float64)[None]  # [1, T]
    beh = torch.tensor(behaviour or [0.0], dtype=torch.float64)[None]
    one = torch.ones(1, dtype=torch.float64)
    w = -(losses.plain_replay_term(cur, beh, one) if beta is None else losses.shaped_replay_term(cur, beh, one, beta))
    seq = math.fsum(a - b for a, b in zip(logp, behaviour))
    return {"seq_log_ratio": seq, "token_log_ratio": seq / max(len(logp), 1), "weight": float(w.mean()),
            "tokens": len(logp)}


def _lowest(options: list[tuple], entropy: Callable[[tuple], float]) -> int:
    return options[selection.choose_trajectory([entropy(c) for c in options], "argmin", random.Random(0))][1]


def _mean(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def wanted(report: dict, data: dict, run_max_age: int | None, policy_max_age: int | None) -> tuple[list, set[int]]:
    """[(arm, step, question, chosen id or None, options)] of both sides' draws, and every id to score."""
    cands, items, ids = W.candidates(data), [], set()
    for arm, draws, max_age in (("what_if", report["per_step"], policy_max_age),
                                ("actual", W.actual(data), run_max_age)):
        for d in draws:
            for q, tid in zip(d["questions"], d["trajectories"]):  # aligned: None where none was chosen
                opts = W.options_at(cands, q, d["step"], max_age)
                items.append((arm, d["step"], q, tid, opts))
                ids |= {c[1] for c in opts} | ({tid} if tid is not None else set())
    return items, ids


def aggregate(items: list, stats: dict[int, dict]) -> dict:
    """Per (arm, step) and per arm: the chosen trajectories' mean log-ratios, entropies and loss weight (per
    token), the share of drawn questions whose lowest-entropy option changes; `choices`: each such question."""
    groups: dict[tuple, dict] = {}
    choices = []
    for arm, step, q, tid, opts in items:
        g = groups.setdefault((arm, step), {"chosen": [], "compared": 0, "changed": 0})
        if tid is not None and tid in stats:
            g["chosen"].append(stats[tid])
        scored = [c for c in opts if c[1] in stats]
        if len(scored) > 1:
            before, now = _lowest(scored, lambda c: c[3]), _lowest(scored, lambda c: stats[c[1]]["entropy"])
            g["compared"] += 1
            g["changed"] += before != now
            choices.append({"arm": arm, "step": step, "question_id": q, "chosen": tid, "options": len(scored),
                            "lowest_stored": before, "lowest_checkpoint": now})

    def row(chosen: list[dict], compared: int, changed: int) -> dict:
        tok = sum(s["tokens"] for s in chosen)
        return {"trajectories": len(chosen), **{k: _mean([s[k] for s in chosen]) for k in (
            "seq_log_ratio", "token_log_ratio", "entropy", "stored_entropy")},
            "weight": sum(s["weight"] * s["tokens"] for s in chosen) / tok if tok else None,
            "questions_compared": compared, "lowest_changed": changed / compared if compared else None}

    per_step = [{"arm": arm, "step": step, **row(g["chosen"], g["compared"], g["changed"])}
                for (arm, step), g in sorted(groups.items())]
    summary = {arm: row([s for (a, _), g in groups.items() if a == arm for s in g["chosen"]],
                        sum(g["compared"] for (a, _), g in groups.items() if a == arm),
                        sum(g["changed"] for (a, _), g in groups.items() if a == arm)) for arm in ARMS}
    return {"per_step": per_step, "summary": summary, "choices": choices}


def rescore(store, run_id: str, report: dict, run_cfg, policy_cfg, model, tokenizer, info: dict,
            progress: Callable[[int, int], None] | None = None) -> dict:
    """The report's `rescore` part: `info` (check_source) and, under `model`, every trajectory either side
    replayed or chose from ({id: stats}), per (arm, step) and per arm (`aggregate`)."""
    data = W.read_run(store, run_id)
    items, ids = wanted(report, data, run_cfg.buffer.max_age, policy_cfg.buffer.max_age)
    rows = read_trajectories(store, run_id, ids)
    prompt_ids = prompts(store, run_cfg, tokenizer, {r["question_id"] for r in rows.values()})
    missing = sorted({r["uid"] for r in rows.values() if r["question_id"] not in prompt_ids})
    if missing:
        raise RescoreError(f"{len(missing)} questions of the run are not in its data any more (e.g. {missing[0]!r}): "
                           "their prompts cannot be rebuilt")
    beta = run_cfg.loss.shaping_beta if run_cfg.loss.policy_shaping else None
    scores = score(model, rows, prompt_ids, tokenizer.pad_token_id, temperature=run_cfg.rollout.temperature,
                   micro_batch_size=2 * run_cfg.train.micro_batch_size, progress=progress)
    stats = {}
    for tid, (logp, h) in scores.items():
        r = rows[tid]
        stats[tid] = {"question_id": r["question_id"], "sampled_step": r["step"], "entropy": h,
                      "stored_entropy": r["stored_entropy"], **trajectory_stats(logp, r["behaviour"], beta)}
    return {**info, "temperature": run_cfg.rollout.temperature, "shaping_beta": beta,
            "trajectories": {str(t): s for t, s in sorted(stats.items())}, **aggregate(items, stats)}
