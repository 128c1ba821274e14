"""The arms of a comparison: on-policy GRPO, ExGRPO and the paper's ablations, as config overrides.

Every arm is the base config (preset + the user's overrides) plus its own overrides, then a run name
`<comparison>-<arm>-s<seed>` and the seed; the same name on a rerun resumes instead of duplicating.
Arms never touch the batch size or the group size, so each step fills the same B*K rollout slots
(see docs/comparison.md for why the *generated* responses per step differ by the replayed ones).
No Prefect import here: the CLI checks arms before any server starts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from exgrpo_core.config.load import ConfigError, load_config
from exgrpo_core.config.schema import ExGRPOConfig

# arm -> (overrides, paper in-distribution average for Qwen2.5-Math-7B (the paper's ablation table); None: not reported)
ARMS: dict[str, tuple[tuple[str, ...], float | None]] = {
    "on_policy": (("buffer.replay_ratio=0",), 45.3),
    "exgrpo": ((), 48.3),
    "no_question_selection": (("selection.question_weighting=question_uniform",), 46.7),
    "no_trajectory_selection": (("selection.trajectory=random",), 46.3),
    "no_selection": (("selection.question_weighting=question_uniform", "selection.trajectory=random"), 46.1),
    "highest_entropy": (("selection.trajectory=argmax",), 46.0),
    "rho_0.25": (("buffer.replay_ratio=0.25",), 46.4),
    "rho_0.75": (("buffer.replay_ratio=0.75",), 44.8),
    "no_policy_shaping": (("loss.policy_shaping=false",), 41.2),
    # the paper's other tables: Gaussian centred on Acc 0.25 (Table 3), no IS correction (Table 6: replayed
    # tokens' w = 1, shaping still applied), retired-set review every 25 steps, 10% (Table 7)
    "mu_0.25": (("selection.mu=0.25",), None),
    "no_is_correction": (("loss.replay_old_logprobs=current",), 47.1),
    "review_retired": (("buffer.review_retired_every=25", "buffer.review_fraction=0.1"), None),
    # the replay lab's methods beside ExGRPO: prompt replay (medium questions re-drawn, K fresh rollouts)
    "prompt_replay": (("buffer.replay_mode=prompt",), None),
    # no replay older than 8 steps; a question's draw weight halves every 8 steps of its newest candidate's age
    "max_age_8": (("buffer.max_age=8",), None),
    "age_decay": (("selection.age_half_life=8",), None),
    # DAPO dynamic sampling: all-equal fresh groups dropped and refilled, with ExGRPO and on-policy
    "dynamic_sampling": (("rollout.dynamic_sampling=true",), None),
    "on_policy_ds": (("buffer.replay_ratio=0", "rollout.dynamic_sampling=true"), None),
    # sequence-level importance weights of fresh tokens, truncated (TIS) or masked (MIS) at 2: they act only
    # where the sampler is not the trainer (vLLM, or rollout.rescore=always)
    "seq_tis": (("loss.tis_cap=2", "loss.is_level=sequence"), None),
    "seq_mask": (("loss.tis_cap=2", "loss.is_level=sequence", "loss.is_mode=mask"), None),
}

LAB_ARMS = ("prompt_replay", "max_age_8", "age_decay", "dynamic_sampling", "on_policy_ds", "seq_tis", "seq_mask")
"""The replay lab's methods beside ExGRPO (docs/benchmarks/replay_lab.md): asked for by name."""
DEFAULT_ARMS = [a for a in ARMS if a not in ("mu_0.25", "no_is_correction", "review_retired", *LAB_ARMS)]
"""What `--arms` left out runs: the paper's ablation table (the other tables' arms are asked for by name)."""
ArmName = Literal[tuple(ARMS)]  # the Prefect form offers these names


@dataclass
class ArmRun:
    """One child training run of a comparison: which arm, which seed, its resolved config."""

    arm: str
    seed: int
    cfg: ExGRPOConfig
    paper_id_avg: float | None
    overrides: list[str] = field(default_factory=list)  # what made cfg from the preset (a deployment's parameters)


def parse_arms(arms: list[str] | str | None) -> list[str]:
    """`None` -> DEFAULT_ARMS; `"a,b"` or `["a", "b"]` -> those, checked against ARMS, order kept."""
    if arms is None:
        return list(DEFAULT_ARMS)
    names = [a.strip() for a in (arms.split(",") if isinstance(arms, str) else arms) if a.strip()]
    unknown = [a for a in names if a not in ARMS]
    if unknown:
        raise ConfigError(f"unknown comparison arm(s) {unknown}; choose from {', '.join(ARMS)}")
    if not names:
        raise ConfigError(f"no comparison arm given; choose from {', '.join(ARMS)}")
    if len(set(names)) < len(names):
        raise ConfigError(f"comparison arms repeat: {names}")
    return names


def parse_seeds(seeds: list[int] | str) -> list[int]:
    """`"0,1"`, `"0-3"` (both ends included) or `[0, 1]` -> a list; at least one, no repeats."""
    try:
        out = []
        for s in (seeds.split(",") if isinstance(seeds, str) else seeds):
            lo, dash, hi = str(s).strip().partition("-")
            out += list(range(int(lo), int(hi) + 1)) if dash and lo else [int(s)] if str(s).strip() else []
    except ValueError:
        raise ConfigError(f"seeds must be integers, e.g. 0,1 or 0-3 (got {seeds!r})") from None
    if not out or len(set(out)) < len(out):
        raise ConfigError(f"seeds must be one or more distinct integers (got {seeds!r})")
    return out


def run_name(comparison: str, arm: str, seed: int) -> str:
    """Child run name, e.g. `cmp-exgrpo-s0`: stable, so a rerun resumes the same run."""
    return f"{comparison}-{arm}-s{seed}"


def build_arm_runs(preset: str, overrides: list[str] | None, arms: list[str] | str | None,
                   seeds: list[int] | str, name: str, evaluate: bool) -> list[ArmRun]:
    """Resolved configs of every (arm, seed), arms outer; the arm's overrides win over the user's."""
    check_name(name)
    runs = []
    base = load_config(preset, overrides)  # a bad user override fails here, once
    final_eval = ["eval.final=true"] if evaluate and can_evaluate(base) else []
    for arm in parse_arms(arms):
        arm_overrides, ref = ARMS[arm]
        for seed in parse_seeds(seeds):
            child = [*(overrides or []), *arm_overrides, *final_eval, f"run.name={run_name(name, arm, seed)}",
                     f"run.seed={seed}"]
            runs.append(ArmRun(arm, seed, load_config(preset, child), ref, child))
    check_equal_slots(runs)
    return runs


def check_name(name: str, kind: str = "comparison") -> None:
    """A comparison's (or sweep's) name prefixes run names and folders: a safe, short word."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,80}", name):
        raise ConfigError(f"{kind} name must be letters, digits, '.', '_' or '-' (got {name!r})")


def can_evaluate(cfg: ExGRPOConfig) -> bool:
    """True when this build has a final evaluation and the config names held-out data for it."""
    ev = cfg.eval
    return "final" in type(ev).model_fields and bool(getattr(ev, "suites", None) or cfg.data.eval_path)


def rollout_slots(cfg: ExGRPOConfig) -> int:
    """Group slots per step, B*K: K generated responses per fresh question, K-1 + 1 replayed per experiential one."""
    return cfg.train.batch_size * cfg.rollout.group_size


def check_equal_slots(runs: list[ArmRun]) -> None:
    """Every arm must fill the same B*K slots per step, or the comparison is refused."""
    slots = {(r.arm, r.seed): rollout_slots(r.cfg) for r in runs}
    if len(set(slots.values())) > 1:
        raise ConfigError(f"arms differ in rollout budget (train.batch_size * rollout.group_size): {slots}")
