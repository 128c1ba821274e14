"""The metric names every run logs per step (the metric contract): one stable, namespaced contract.

Core functions return stats dicts keyed by these names; the flows log them to MLflow and the
database, and the dashboard reads them. `bucket_key(k)` covers the per-bucket counts.
"""

from __future__ import annotations

import re

# rollout / verify
REWARD_MEAN = "rollout/reward_mean"
FRESH_PASS1 = "rollout/fresh_pass1"
SOLVE_ALL = "rollout/solve_all"
SOLVE_NONE = "rollout/solve_none"
RESPONSE_LENGTH = "rollout/response_length"
TRUNCATION_RATE = "rollout/truncation_rate"
FRESH_ENTROPY = "rollout/fresh_entropy"
SAMPLER_TRAINER_GAP = "rollout/logprob_gap"
# (rollout.overlap) steps from the policy that sampled the fresh batch to the one it trains; 1 when a batch
# sampled ahead was older than rollout.max_staleness (dropped and sampled again)
FRESH_STALENESS = "rollout/fresh_staleness"
FRESH_DROPPED = "rollout/stale_dropped"
RESPONSES = "rollout/responses"
VERIFY_TIMEOUTS = "verify/timeouts"
VERIFY_NO_ANSWER = "verify/no_answer"
VERIFY_ERRORS = "verify/errors"  # items a reward function / server could not score: an exception, or an unusable value
VERIFY_TRUNCATED_REWARDED = "verify/truncated_rewarded"  # responses cut at the length limit the grader rewarded
DS_DROPPED = "rollout/ds_dropped_groups"  # dynamic sampling: all-equal fresh groups left out of training (0: off)
DS_ROUNDS = "rollout/ds_rounds"  # dynamic sampling: extra generation rounds that refilled the batch
# buffer
BUFFER_QUESTIONS = "buffer/questions"
BUFFER_TRAJECTORIES = "buffer/trajectories"
RETIRED_QUESTIONS = "buffer/retired_questions"
REPLAY_ACTIVE = "buffer/replay_active"
COLLECTED = "buffer/collected"
DUPLICATES = "buffer/duplicates"
NEWLY_RETIRED = "buffer/newly_retired"
STORED_ROLLOUTS = "buffer/stored_rollouts"
POOLED_ZERO_SUCCESS = "buffer/pooled_zero_success"  # pooled questions whose group scored 0/K this step
DISTINCT_QUESTIONS = "buffer/distinct_questions"  # questions rolled out at least once so far
REVIEWED_RETIRED = "buffer/reviewed_retired"  # retired questions a review put back this step (0 off review steps)
# selection
REPLAYED_SAMPLES = "select/replayed_samples"
REPLAYED_ENTROPY = "select/replayed_entropy"
CANDIDATES = "select/candidates"
TARGET_GAP = "select/target_gap"  # total variation between the step's replays by bucket and the target weights (0: none)
UNFILLED_SLOTS = "select/unfilled_slots"  # replay slots of the step (round(rho*B) once replay is on) left without a trajectory
# staleness of the replayed trajectories (docs/monitors.md): age = step - the step whose policy sampled it;
# w = pi_theta / pi_behaviour per replayed token and f(w) the weight the replay term applies, both
# under the policy at the step's start (before its first optimiser step); 0 when nothing is replayed
REPLAY_AGE_MEAN = "select/age_mean"
REPLAY_AGE_MAX = "select/age_max"
REPLAY_W_P10 = "select/w_p10"
REPLAY_W_P50 = "select/w_p50"
REPLAY_W_P90 = "select/w_p90"
REPLAY_W_MAX = "select/w_max"
REPLAY_FW_P10 = "select/fw_p10"
REPLAY_FW_P50 = "select/fw_p50"
REPLAY_FW_P90 = "select/fw_p90"
# importance ratios (sequence level: prod over the tokens of pi / pi_behaviour): the sampler-trainer mismatch of fresh
# rollouts (1 where the sampler is the trainer), the staleness of replayed ones (0 when none), and the fresh tokens
# the importance mask drops (loss.is_mode=mask; else 0)
IS_FRESH_SEQ_RATIO = "is/fresh_seq_ratio_mean"
IS_REPLAY_SEQ_RATIO = "is/replay_seq_ratio_mean"
IS_MASKED_FRACTION = "is/masked_fraction"
# loss / optimisation
LOSS_TOTAL = "loss/total"
LOSS_ONPOLICY = "loss/onpolicy"
LOSS_OFFPOLICY = "loss/offpolicy"
LOSS_ENTROPY = "loss/entropy"
LOSS_KL = "loss/kl"
CLIPFRAC = "loss/clipfrac"
IW_MEAN = "loss/iw_mean"
IW_MAX = "loss/iw_max"
IW_VAR = "loss/iw_var"
SHAPED_IW_MEAN = "loss/shaped_iw_mean"
REPLAY_TOKENS = "loss/replay_tokens"
ONPOLICY_TOKENS = "loss/onpolicy_tokens"
GRAD_NORM = "loss/grad_norm"
SKIPPED_STEPS = "loss/skipped_steps"
OPTIMIZER_STEPS = "loss/optimizer_steps"
LR = "loss/lr"
# timings
TIME_ROLLOUT = "perf/rollout_s"
TIME_VERIFY = "perf/verify_s"
TIME_BUFFER = "perf/buffer_s"
TIME_SELECT = "perf/select_s"
TIME_TRAIN = "perf/train_s"
TIME_LOG = "perf/log_s"
TIME_ITERATION = "perf/iteration_s"
TIME_CHECKPOINT = "perf/checkpoint_s"
ROLLOUT_TOKENS_PER_S = "perf/rollout_tokens_per_s"
ROLLOUT_ROW_STEPS = "perf/rollout_row_steps"  # decode forwards x rows in them (this process; transformers engine)
ROLLOUT_USEFUL_ROW_STEPS = "perf/rollout_useful_row_steps"  # of which before each row's end: its tokens
TRAIN_TOKENS_PER_S = "perf/train_tokens_per_s"
TRAIN_TFLOPS = "perf/train_tflops"  # model TFLOP/s of the optimiser call (flops.py); MFU = this / peak
# evaluation: eval/<benchmark>/<metric> (see eval_key), eval/average/pass_at_1, and the eval timings
EVAL_PREFIX = "eval/"
EVAL_METRICS = ("pass@1", "samples", "questions", "response_length", "truncation_rate", "no_answer_rate",
                "timeout_rate")
"""Per-benchmark metric names (tables, DB `eval_results`); plus `pass@k` for the configured k."""
EVAL_SECONDS = "eval/seconds"
EVAL_QUESTIONS_PER_S = "eval/questions_per_s"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\- ]")
_EVAL_KEY = re.compile(r"eval/[^/]+/(pass_at_\d+|" + "|".join(m for m in EVAL_METRICS if "@" not in m) + ")")


def eval_key(benchmark: str, metric: str) -> str:
    """MLflow / step-metric key of an eval metric: `eval/AIME24/pass_at_1` (MLflow names forbid '@').

    Benchmark names keep letters, digits and `_-. `; anything else becomes `_`.
    """
    return f"{EVAL_PREFIX}{_UNSAFE.sub('_', benchmark)}/{metric.replace('@', '_at_')}"


# external rollout engine (vLLM only; absent with the transformers engine)
ENGINE_PREFIX = "engine/"
ENGINE_SYNC_GAP = ENGINE_PREFIX + "sync_logprob_gap"
ENGINE_SYNC_S = ENGINE_PREFIX + "sync_s"
# several training processes only (team.py): relative spread of the processes' summed weights
DIST_PREFIX = "dist/"
DIST_PARAM_GAP = DIST_PREFIX + "param_gap"


# replay-health monitors (exgrpo_core/observe/monitors.py): `monitor/<name>` is stored at the steps where it fired
MONITOR_PREFIX = "monitor/"
MONITORS = ("fresh_entropy", "replayed_entropy", "zero_variance", "iw_max", "iw_var", "logprob_gap",
            "timeout_rate", "retired_fraction", "unfilled_slots", "fresh_staleness", "stale_dropped")


def monitor_key(name: str) -> str:
    """`monitor/iw_max`: present at a step where that monitor fired, its value the watched quantity."""
    return MONITOR_PREFIX + name


def step_number(index: int) -> int:
    """The step a user reads for a 0-based step index (the loop's, the database's, trainer_state.pt's):
    the optimiser updates done once that step is over, so step N is the step that performs update N
    and index -1 (the starting policy) is step 0. MLflow steps, artifact and checkpoint names, task
    names, monitors and every printed step use it (docs/implementation_details.md, step numbering)."""
    return index + 1


def bucket_key(k: int) -> str:
    """`buffer/bucket_3`: number of questions whose latest group had k correct."""
    return f"buffer/bucket_{k}"


OVERLAP_METRICS: tuple[str, ...] = (FRESH_STALENESS, FRESH_DROPPED)
"""Logged every step of a run with rollout.overlap > 0 only."""

STEP_METRICS: tuple[str, ...] = tuple(
    v for name, v in sorted(globals().items()) if name.isupper() and isinstance(v, str) and "/" in v
    and not v.startswith((EVAL_PREFIX, ENGINE_PREFIX, DIST_PREFIX, MONITOR_PREFIX)) and v not in OVERLAP_METRICS)
"""Logged every training step (evaluation keys appear only at evaluation steps; OVERLAP_METRICS with overlap)."""


def declared(key: str, group_size: int) -> bool:
    """True if `key` is part of the contract (fixed names, bucket counts 0..K, eval and monitor keys)."""
    if key in STEP_METRICS or key in OVERLAP_METRICS or key in (EVAL_SECONDS, EVAL_QUESTIONS_PER_S) \
            or _EVAL_KEY.fullmatch(key):
        return True
    if key in (ENGINE_SYNC_GAP, ENGINE_SYNC_S, DIST_PARAM_GAP) or key in {monitor_key(n) for n in MONITORS}:
        return True
    return key in {bucket_key(k) for k in range(group_size + 1)}
