"""One ExGRPO iteration, stage by stage, in the order of the paper's algorithm box.

select questions (fresh + experiential) -> rollout -> verify -> buffer update (one transaction)
-> entropy recompute + trajectory selection -> mixed groups + advantages -> optimise -> metrics.
Each stage is one function of the session returning plain records and a stats dict; the Prefect
flow calls them as tasks, `run_iteration` calls them directly (tests, benchmarks).
Deviation: replay switches on *at* the step whose correct fraction first exceeds the threshold, so
that step's experience is collected and replayed from the next step on.
"""

from __future__ import annotations

import time
from functools import partial

import torch

from exgrpo_core import metrics as M
from exgrpo_core.algorithm import age, dynamic_sampling, importance, losses, selection, spread
from exgrpo_core.algorithm.advantages import compute_group_advantages
from exgrpo_core.observe import monitors, staleness
from exgrpo_core.reward import audit, source as sources
from exgrpo_core.rollout import overlap
from exgrpo_core.rollout.engine import TransformersEngine
from exgrpo_core.run.session import Session
from exgrpo_core.training.batch import collate
from exgrpo_core.training.flops import model_train_flops
from exgrpo_core.types import BatchPlan, GroupResult, Rollout


def replay_weights(cfg) -> dict[int, float]:
    """The run's question-selection weights w(k/K) by bucket (`selection.bucket_weights` on its config)."""
    sel = cfg.selection
    return selection.bucket_weights(cfg.rollout.group_size, sel.question_weighting, sel.sigma, sel.sigma_unit,
                                    sel.mu, top=cfg.reward.continuous)


target_gap = selection.target_gap  # the step's select/target_gap (kept here: callers read it from the loop)


def plan_batch(s: Session) -> BatchPlan:
    """Draw rho*B experiential questions by bucket weight, and the rest fresh (docs/implementation_details.md)."""
    cfg = s.cfg
    if overlap.planned(s) is not None:  # planned and sampled ahead (rollout.overlap)
        return overlap.planned(s)
    replay: list[str] = []
    if s.replay_active and cfg.replay_questions > 0:
        weights = replay_weights(cfg)
        per_question = cfg.selection.question_weighting in selection.PER_QUESTION
        if cfg.buffer.max_age is not None or cfg.selection.age_half_life is not None:  # the age rules (age.py)
            replay = s.store.sample_aged_replay_questions(
                s.run_id, cfg.replay_questions, weights, s.rng, s.step, per_question, cfg.buffer.max_age,
                cfg.selection.age_half_life)
        else:  # = selection.sample_questions(buffer_state.buckets, ...), reading only bucket sizes and chosen uids
            replay = s.store.sample_replay_questions(s.run_id, cfg.rollout.group_size, cfg.replay_questions, weights,
                                                     s.rng, per_question=per_question)
    fresh = draw_fresh(s, cfg.train.batch_size - len(replay), set(replay))
    return BatchPlan(s.step, fresh, replay, cfg.replay_questions if s.replay_active else 0)


def draw_fresh(s: Session, n: int, exclude: set[str]) -> list[str]:
    """The next n fresh questions of the run's sampler (its position is checkpointed), none of `exclude`."""
    b = s.cfg.buffer
    return s.sampler.next(n, exclude=exclude, retired=s.store.retired_uids(s.run_id) if b.skip_retired_fresh else set(),
                          skip_retired=b.skip_retired_fresh, min_remaining=b.min_fresh_remaining)


def generate(s: Session, plan: BatchPlan) -> tuple[list[Rollout], dict]:
    """Sample K (fresh) or K-1 (experiential) responses, then score them with the trainer when
    the sampler's numbers are not already the trainer's (`needs_rescore`; the log-prob gap is then 0)."""
    t0 = time.perf_counter()
    steps0 = getattr(s.engine, "row_steps", None)
    gens, version, dropped = overlap.take(s, plan)  # (rollout.overlap) sampled ahead, by policy `version`
    rollouts, gap = sample(s, plan.fresh, plan.replay, version, gens)
    if s.cfg.rollout.dynamic_sampling:
        gap += refill(s, plan, rollouts)
    tokens = sum(len(r.response_ids) for r in rollouts)
    dt = time.perf_counter() - t0
    work = {} if steps0 is None else {M.ROLLOUT_ROW_STEPS: float(s.engine.row_steps - steps0),
                                      M.ROLLOUT_USEFUL_ROW_STEPS: float(tokens)}
    if s.cfg.rollout.overlap:
        work.update({M.FRESH_STALENESS: float(plan.step - version), M.FRESH_DROPPED: float(dropped)})
    return rollouts, {**work,
        M.RESPONSES: float(len(rollouts)), M.TIME_ROLLOUT: dt, M.ROLLOUT_TOKENS_PER_S: tokens / max(dt, 1e-9),
        M.RESPONSE_LENGTH: tokens / max(len(rollouts), 1),
        M.TRUNCATION_RATE: sum(r.truncated for r in rollouts) / max(len(rollouts), 1),
        M.FRESH_ENTROPY: _mean([r.entropy for r in rollouts]), M.SAMPLER_TRAINER_GAP: _mean(gap),
        **mismatch_stats(rollouts, s.cfg.loss)}


def mismatch_stats(rollouts: list[Rollout], loss) -> dict:
    """The sampler-trainer mismatch of the fresh rollouts: their mean sequence ratio pi_trainer / pi_sampler (1 where
    the sampler is the trainer) and the fraction of their tokens the importance mask (`loss.is_mode=mask`) drops."""
    scored = [r for r in rollouts if r.sampler_logprobs is not None]
    ratios = [importance.sequence_ratio(r.behaviour_logprobs, r.sampler_logprobs) for r in scored]
    masked, tokens = 0, sum(len(r.response_ids) for r in rollouts)
    if loss.tis_cap is not None and loss.is_mode == "mask":
        for r in scored:
            w = importance.fresh_weights(torch.tensor(r.behaviour_logprobs), torch.tensor(r.sampler_logprobs),
                                         loss.tis_cap, loss.is_level, loss.is_mode)
            masked += int((w == 0).sum())
    return {M.IS_FRESH_SEQ_RATIO: _mean(ratios) if ratios else 1.0, M.IS_MASKED_FRACTION: masked / max(tokens, 1)}


def sample(s: Session, fresh: list[str], replay: list[str], step: int,
           gens=None) -> tuple[list[Rollout], list[float]]:
    """K responses per fresh question, K-1 per experiential one (K with prompt replay), in one batch, scored
    by the trainer where needed; also each token's sampler-trainer log-prob gap. `step`: the policy version
    sampling them; `gens`: the groups already sampled (rollout.overlap)."""
    K, cfg = s.cfg.rollout.group_size, s.cfg.rollout
    uids = fresh + replay
    counts = [K] * len(fresh) + [K - (s.cfg.buffer.replay_mode == "trajectory")] * len(replay)
    rollouts: list[Rollout] = []
    entropies: list[list[float]] = []
    if gens is None:
        gens = s.team.generate([s.prompt_ids(u) for u in uids], counts, temperature=cfg.temperature,
                               max_new_tokens=cfg.max_response_tokens)  # one batch: K and K-1 samples together
    for uid, group in zip(uids, gens):
        rollouts += [Rollout(uid, s.prompt_ids(uid), g.response_ids, g.logprobs, g.text, g.truncated, step)
                     for g in group]
        entropies += [g.entropies for g in group]
    sampler_logp = [r.behaviour_logprobs for r in rollouts]
    if needs_rescore(s):
        score_rollouts(s, rollouts)
        for r, sl in zip(rollouts, sampler_logp):
            r.sampler_logprobs = sl  # kept for truncated importance sampling (loss.tis_cap)
    else:  # the sampler's log-probs and entropies are the trainer's: H(o) is their response mean
        for r, ent in zip(rollouts, entropies):
            r.entropy = float(sum(ent) / len(ent)) if ent else 0.0
    return rollouts, [abs(a - b) for r, sl in zip(rollouts, sampler_logp) for a, b in zip(r.behaviour_logprobs, sl)]


def refill(s: Session, plan: BatchPlan, rollouts: list[Rollout]) -> list[float]:
    """DAPO dynamic sampling (algorithm/dynamic_sampling.py): grade the fresh groups, list the all-equal ones in
    `plan.dropped` and draw as many further fresh questions, for at most `rollout.dynamic_sampling_rounds`
    rounds; the new rollouts join `rollouts` (graded) and their questions `plan.fresh`. Returns their gaps."""
    gaps: list[float] = []
    pending = set(plan.fresh)
    todo = [r for r in rollouts if r.question_uid in pending]
    while True:
        grade(s, todo)
        groups: dict[str, list[float]] = {}
        for r in todo:
            groups.setdefault(r.question_uid, []).append(r.reward)
        drop = dynamic_sampling.dropped(groups)
        plan.dropped += drop
        if not drop or plan.rounds >= s.cfg.rollout.dynamic_sampling_rounds:
            return gaps
        new = draw_fresh(s, len(drop), set(plan.fresh) | set(plan.replay))
        if not new:
            return gaps
        plan.rounds += 1
        todo, gap = sample(s, new, [], plan.step)
        plan.fresh += new
        rollouts += todo
        gaps += gap


def needs_rescore(s: Session) -> bool:
    """Whether fresh rollouts need the trainer's scoring forward (`rollout.rescore`, see its doc).

    With the transformers engine at top_p = 1 computing in float32, the sampler's processed scores
    are the trainer's logits / temperature from the same weights, so its log-probs and entropies are
    the trainer's up to float rounding (KV cache, padding side); TRL skips this pass the same way.
    The engine ignores the model's own generation config; logits processors the caller gave it
    change the sampled distribution, so they force the pass.
    """
    cfg = s.cfg.rollout
    return (cfg.rescore == "always" or not isinstance(s.engine, TransformersEngine) or cfg.top_p < 1
            or bool(getattr(s.engine, "logits_processors", None))
            or sampler_dtype(s.engine.model, s.accelerator) != torch.float32
            or getattr(s.engine, "inference_dtype", None) not in (None, torch.float32))  # a bf16 sampling copy


def sampler_dtype(model, accelerator) -> torch.dtype:
    """The dtype the transformers sampler really computed in: the accelerator's autocast dtype under
    mixed precision, else the model's floating-point parameters' (a bf16 model on CPU runs in bf16
    whatever the accelerator says)."""
    mixed = getattr(accelerator, "mixed_precision", "no")
    if mixed in ("bf16", "fp16"):
        return torch.bfloat16 if mixed == "bf16" else torch.float16
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def score_rollouts(s: Session, rollouts: list[Rollout], entropy_kind: str = "mean") -> None:
    """Trainer log-probs and H(o) of each rollout, written into the records (docs/implementation_details.md).

    Logits are divided by the rollout temperature (1.0 by default, as in the paper), as verl does, so
    the trained distribution is the one that was sampled. Spread over the processes (team.py).
    """
    if not rollouts:
        return
    for r, (logp, h) in zip(rollouts, s.team.score(rollouts, entropy_kind)):
        r.behaviour_logprobs = logp
        r.entropy = h


def verify(s: Session, rollouts: list[Rollout]) -> dict:
    """Grade every response with its row's grader (math-verify, or the final choice letter for
    multiple-choice rows, as evaluation does), recording what it read; switch replay on when the
    batch is good enough."""
    t0 = time.perf_counter()
    early = [r for r in rollouts if r.reason != "unverified"]  # graded by dynamic sampling (`refill`)
    failed, truncated_rewarded = grade(s, [r for r in rollouts if r.reason == "unverified"])
    if early:  # their failures and rewarded truncations read back from the records
        scored = getattr(s, "reward", None) is not None
        failed = {"error": failed.get("error", 0) + failed.get("invalid", 0)
                  + sum(scored and r.reason in ("error", "invalid") for r in early)}
        truncated_rewarded += sum(r.reason == "truncated" if s.cfg.reward.truncated == "zero" else
                                  r.truncated and r.reward > 0 for r in early)
    frac = (selection.batch_mean_reward if s.cfg.reward.continuous else selection.batch_correct_fraction)(
        [r.reward for r in rollouts])
    if (not s.replay_active and s.cfg.replay_questions > 0
            and selection.replay_should_start(frac, s.cfg.buffer.start_threshold)):
        s.replay_active = True
        s.replay_started_step = s.step  # this step still trains as warm-up (clipped), as the authors'
        s.store.update_run(s.run_id, replay_active=True, replay_started_step=s.step)
    return {M.REWARD_MEAN: frac, M.VERIFY_TIMEOUTS: float(sum(r.reason == "timeout" for r in rollouts)),
            M.VERIFY_NO_ANSWER: float(sum(r.reason == "no_answer" for r in rollouts)),
            M.VERIFY_ERRORS: float(failed.get("error", 0) + failed.get("invalid", 0)),
            M.VERIFY_TRUNCATED_REWARDED: float(truncated_rewarded),
            M.REPLAY_ACTIVE: float(s.replay_active), M.TIME_VERIFY: time.perf_counter() - t0}


def grade(s: Session, rollouts: list[Rollout]) -> tuple[dict, int]:
    """Grade these rollouts in place (reward function / server, else math-verify or the choice letter) and apply
    `reward.truncated`: the failures by reason and how many truncated responses the grader rewarded."""
    if not rollouts:
        return {}, 0
    questions = [s.questions[r.question_uid] for r in rollouts]
    failed: dict = {}
    if getattr(s, "reward", None) is not None:  # reward.fn / reward.url
        failed = sources.grade(s.reward, rollouts, questions, *sources.describe(s.cfg.reward))
        sources.warn_failures(s.cfg.reward, rollouts, failed)
    else:
        audit.grade_and_describe(s.verify, rollouts, questions, require_think=s.cfg.reward.require_think)
    return failed, audit.apply_truncation_rule(rollouts, s.cfg.reward.truncated)


def update_buffer(s: Session, plan: BatchPlan, rollouts: list[Rollout]) -> tuple[list[GroupResult], dict]:
    """Record every group, collect eligible correct responses, retire solved questions: one transaction; on
    a review step (buffer.review_retired_every) a second puts part of the retired set back."""
    t0 = time.perf_counter()
    by_uid: dict[str, list[Rollout]] = {}
    for r in rollouts:
        by_uid.setdefault(r.question_uid, []).append(r)
    groups = [GroupResult(u, by_uid[u]) for u in plan.fresh]
    replayed = int(s.cfg.buffer.replay_mode == "trajectory")  # prompt replay: K fresh, no stored trajectory
    groups += [GroupResult(u, by_uid[u], is_replay=True, replayed=replayed) for u in plan.replay]
    b = s.cfg.buffer
    drawn = s.store.latest_buckets(s.run_id, plan.replay)  # the buckets the replayed questions came from
    if s.cfg.reward.continuous:  # buckets by reward spread (paper v2 §5.3); 0/1 rewards keep k
        spread.assign(groups, s.cfg.rollout.group_size, b.spread_eps)
    stats = s.store.apply_buffer_update(
        s.run_id, plan.step, groups, group_size=s.cfg.rollout.group_size,
        collect=s.replay_active or b.collect_before_replay, collect_min_k=b.collect_min_k,
        collect_max_k=s.cfg.collect_max_k, retire=b.retire_solved, store_all=b.store_all_rollouts,
        keep_bucket_on_zero=b.zero_success == "keep_bucket")
    reviewing = b.review_retired_every > 0 and M.step_number(plan.step) % b.review_retired_every == 0
    # retired-set review (paper Table 7), after this step's retirements; draws from s.rng only when reviewing
    reviewed = s.store.review_retired(s.run_id, plan.step, b.review_fraction, s.rng) if reviewing else []
    stats[M.REVIEWED_RETIRED] = float(len(reviewed))
    per_question = s.cfg.selection.question_weighting in selection.PER_QUESTION  # no per-bucket target
    stats[M.TARGET_GAP] = target_gap(list(drawn.values()), {} if per_question else replay_weights(s.cfg))
    fresh = [r.reward for g in groups if not g.is_replay for r in g.rollouts]
    stats[M.FRESH_PASS1] = _mean(fresh)
    stats[M.DS_DROPPED], stats[M.DS_ROUNDS] = float(len(plan.dropped)), float(plan.rounds)
    stats[M.TIME_BUFFER] = time.perf_counter() - t0
    dropped = set(plan.dropped)  # dynamic sampling: recorded above, left out of training (unless nothing is left)
    return [g for g in groups if g.question_uid not in dropped] or groups, stats


def select_trajectories(s: Session, plan: BatchPlan) -> tuple[dict[str, Rollout], dict]:
    """For each experiential question, replay its stored trajectory chosen by current-policy entropy."""
    t0 = time.perf_counter()
    wanted = plan.replay if s.cfg.buffer.replay_mode == "trajectory" else []  # prompt replay: no trajectory
    # token ids of every candidate; stored log-probs and text are read for the chosen ones only
    cands = s.store.candidates(s.run_id, wanted, before_step=plan.step, payload=False) if wanted else {}
    exp = {e.id: e for uid in plan.replay for e in cands.get(uid, [])
           if age.young_enough(plan.step - e.step, s.cfg.buffer.max_age)}
    rows = [Rollout(e.question_uid, s.prompt_ids(e.question_uid), e.response_ids, [0.0] * len(e.response_ids), "",
                    False, e.step, reward=1.0, reason="replayed", replayed_from=e.id) for e in exp.values()]
    score_rollouts(s, rows, s.cfg.selection.entropy)  # recompute H(o) under the current policy
    chosen: dict[str, Rollout] = {}
    for uid in wanted:
        options = [r for r in rows if r.question_uid == uid]
        if options:
            chosen[uid] = options[selection.choose_trajectory([r.entropy for r in options],
                                                              s.cfg.selection.trajectory, s.rng)]
    current = {uid: r.behaviour_logprobs for uid, r in chosen.items()}  # the policy at the step's start
    for e in s.store.with_payloads(s.run_id, [exp[r.replayed_from] for r in chosen.values()]):
        r = chosen[e.question_uid]
        r.behaviour_logprobs, r.text = e.behaviour_logprobs, e.text  # (code) the trainer's log-probs at collection
        r.reward = e.reward  # 1 with 0/1 rewards; its stored value when continuous
    s.store.record_replays(s.run_id, plan.step, [(r.replayed_from, r.entropy) for r in chosen.values()])
    shaping = s.cfg.loss.shaping_beta if s.cfg.loss.policy_shaping else None
    stale = staleness.replay_stats(plan.step, [r.step for r in chosen.values()], [current[u] for u in chosen],
                                   [r.behaviour_logprobs for r in chosen.values()], shaping)
    replay_ratio = [importance.sequence_ratio(current[u], r.behaviour_logprobs) for u, r in chosen.items()]
    return chosen, {M.REPLAYED_SAMPLES: float(len(chosen)), M.CANDIDATES: float(len(rows)),
                    M.IS_REPLAY_SEQ_RATIO: _mean(replay_ratio),
                    M.REPLAYED_ENTROPY: _mean([r.entropy for r in chosen.values()]),
                    M.UNFILLED_SLOTS: float(max(plan.replay_slots - len(chosen if wanted else plan.replay), 0)),
                    **stale,
                    M.TIME_SELECT: time.perf_counter() - t0}


def train(s: Session, groups: list[GroupResult], replayed: dict[str, Rollout]) -> dict:
    """Mixed groups -> group-relative advantages -> mixed-policy loss -> optimiser steps (docs/implementation_details.md)."""
    t0 = time.perf_counter()
    cfg = s.cfg
    overlap.start_next(s, plan_batch)  # step t+1's rollouts sample while this step trains (rollout.overlap)
    stats: dict[str, float] = {}
    rows, advs, qidx, adv_stats = shuffled_rows(groups, replayed, cfg.loss.std_normalize, s.rng)
    for key in (M.SOLVE_ALL, M.SOLVE_NONE):
        stats[key] = _mean([st[key] for st in adv_stats])
    clip = clips_onpolicy(cfg.loss.clip_mode, s.replay_active and s.replay_started_step != s.step)
    onpolicy_term = (partial(losses.clipped_ratio_term, clip_eps=cfg.loss.clip_eps) if clip
                     else losses.unclipped_ratio_term)
    replay_term = (partial(losses.shaped_replay_term, beta=cfg.loss.shaping_beta) if cfg.loss.policy_shaping
                   else losses.plain_replay_term)
    replay_term = losses.replay_behaviour(replay_term, cfg.loss.replay_old_logprobs)
    batch = collate(rows, advs, s.engine.pad_id, qidx, tis_cap=cfg.loss.tis_cap, is_level=cfg.loss.is_level,
                    is_mode=cfg.loss.is_mode)
    flops = model_train_flops(s.accelerator.unwrap_model(s.model), batch.attention_mask.sum(1).tolist())
    t_opt = time.perf_counter()
    stats.update(s.team.optimise(
        batch, n_minibatches=cfg.train.batch_size // cfg.train.mini_batch_size,
        micro_batch_size=cfg.train.micro_batch_size, micro_batch_tokens=cfg.train.micro_batch_tokens,
        onpolicy_term=onpolicy_term, replay_term=replay_term,
        aggregation=cfg.loss.aggregation, max_response_len=cfg.rollout.max_response_tokens,
        entropy_coef=cfg.loss.entropy_coef, kl_coef=cfg.loss.kl_coef, temperature=cfg.rollout.temperature,
        max_grad_norm=cfg.train.max_grad_norm, skip_grad_norm=cfg.train.skip_grad_norm,
        entropy_micro_tokens=cfg.loss.entropy_micro_tokens, pack=cfg.train.pack_sequences))
    stats[M.TRAIN_TFLOPS] = flops / max(time.perf_counter() - t_opt, 1e-9) / 1e12
    if hasattr(s.engine, "push_weights"):  # an engine with its own copy of the weights (vLLM, remote)
        overlap.wait(s)  # (rollout.overlap, remote) step t+1's requests finish on the weights they were sent to
        dtype = getattr(s.engine, "weight_dtype", None) or getattr(torch, s.cfg.model.dtype)
        stats.update(s.team.push_weights(s.prompt_ids(min(s.questions)), dtype))
    dt = time.perf_counter() - t0
    stats[M.TIME_TRAIN] = dt
    stats[M.TRAIN_TOKENS_PER_S] = float(batch.attention_mask.sum()) / max(dt, 1e-9)
    stats[M.LR] = s.optimizer.param_groups[0]["lr"]
    return stats


def clips_onpolicy(clip_mode: str, replay_on: bool) -> bool:
    """Whether on-policy tokens get the PPO clip (code: clipped in the warm-up, unclipped with replay).

    `replay_on`: replay was active when the step began; the step that switches it on (its correct
    fraction passed the threshold) is still a warm-up step, as in the authors' code, which switches
    after the step's update.
    """
    if clip_mode not in ("until_replay", "always", "never"):
        raise ValueError(f"unknown clip mode {clip_mode!r}; choose from until_replay, always, never")
    return clip_mode == "always" or (clip_mode == "until_replay" and not replay_on)


def shuffled_rows(groups: list[GroupResult], replayed: dict[str, Rollout], std_normalize: bool,
                  rng) -> tuple[list[Rollout], list[float], list[int], list[dict]]:
    """Mixed groups with group-relative advantages (paper Eq. 2), in a random group order.

    (code) the collated batch is shuffled before it is cut into mini-batches, so fresh and mixed
    groups share mini-batches; `rng` is the run's seeded generator (checkpointed, so a resumed run
    draws the same order). A group's rows stay together and keep their order.

    Returns rows, their advantages, the batch position of each row's group (`question_index`) and
    each group's advantage stats (solve_all / solve_none).
    """
    order = list(range(len(groups)))
    rng.shuffle(order)
    rows, advs, qidx, adv_stats = [], [], [], []
    for q, i in enumerate(order):
        g = groups[i]
        members = g.rollouts + ([replayed[g.question_uid]] if g.question_uid in replayed else [])
        a, st = compute_group_advantages(torch.tensor([[r.reward for r in members]]), std_normalize)
        adv_stats.append(st)
        rows += members
        advs += a[0].tolist()
        qidx += [q] * len(members)
    return rows, advs, qidx, adv_stats


def buffer_snapshot(s: Session) -> dict:
    """Pool and retired-set sizes and bucket counts k = 0..K after the step (the metric contract)."""
    K = s.cfg.rollout.group_size
    state = s.store.buffer_state(s.run_id, K, with_buckets=False)
    out = {M.BUFFER_QUESTIONS: float(state.pool_questions), M.BUFFER_TRAJECTORIES: float(state.pool_trajectories),
           M.RETIRED_QUESTIONS: float(state.retired_questions), M.REPLAY_ACTIVE: float(s.replay_active),
           M.DISTINCT_QUESTIONS: float(sum(state.bucket_counts.values()))}
    out.update({M.bucket_key(k): float(state.bucket_counts.get(k, 0)) for k in range(K + 1)})
    return out


def run_iteration(s: Session) -> dict:
    """The whole iteration without an orchestrator: returns the step's metrics and advances the step."""
    t0 = time.perf_counter()
    plan = plan_batch(s)
    rollouts, st1 = generate(s, plan)
    st2 = verify(s, rollouts)
    groups, st3 = update_buffer(s, plan, rollouts)
    replayed, st4 = select_trajectories(s, plan)
    st5 = train(s, groups, replayed)
    out = {**st1, **st2, **st3, **st4, **st5, **buffer_snapshot(s)}
    out[M.TIME_ITERATION] = time.perf_counter() - t0
    out.update({f.key: f.value for f in check_monitors(s, plan.step, out, store=False)})
    s.store.log_metrics(s.run_id, plan.step, out)
    s.store.update_run(s.run_id, step=plan.step)
    s.step += 1
    return out


def check_monitors(s: Session, step: int, stats: dict, store: bool = True) -> list[monitors.Firing]:
    """The replay-health firings of 0-based step `step` (exgrpo_core/observe/monitors.py), each naming its step
    number; `store`: record each as the step metric `monitor/<name>` = its watched value. Reporting them and
    stopping is the caller's."""
    fired = monitors.check(stats, s.cfg.monitors, step=M.step_number(step), train_questions=len(s.questions),
                           replay_slots=s.cfg.replay_questions, max_staleness=overlap.bound(s.cfg.rollout))
    if fired and store:
        s.store.log_metrics(s.run_id, step, {f.key: f.value for f in fired})
    return fired


def _mean(xs) -> float:
    xs = [x for x in xs if x == x]  # drop NaN
    return float(sum(xs) / len(xs)) if xs else 0.0
