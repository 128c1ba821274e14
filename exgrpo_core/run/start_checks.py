"""A run's settings checked before anything is built (the CLI's pre-flight, the Prefect form, `open_worker`):
each failure one ConfigError line."""

from __future__ import annotations

import math
import os
from pathlib import Path

from exgrpo_core.config.load import ConfigError, flatten
from exgrpo_core.config.schema import ExGRPOConfig
from exgrpo_core.models import load as models
from exgrpo_core.run import locks


def launched_world() -> int:
    """Training processes this launch starts: WORLD_SIZE (set by torchrun and accelerate launch), else 1."""
    value = os.environ.get("WORLD_SIZE", "")
    return int(value) if value.isdigit() and int(value) > 0 else 1


def check_settings(cfg: ExGRPOConfig) -> None:
    """One ConfigError line, before anything is built, for: a run name that is not one folder name, a
    non-finite number (`train.lr=inf`), a zero-size tiny model, a model path that does not exist,
    `rollout.overlap` under several training processes."""
    locks.check_run_name(cfg.run.name)
    for key, value in flatten(cfg).items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{key} must be a finite number (got {value})")
    if cfg.model.name_or_path in (models.TINY, models.TINY_SFT):
        for key, value in cfg.model.tiny.model_dump().items():
            if value < 1:
                raise ConfigError(f"model.tiny.{key} must be >= 1 (got {value})")
    path = cfg.model.name_or_path
    if path.startswith(("/", "./", "../", "~")) and not Path(path).expanduser().exists():
        raise ConfigError(f"model.name_or_path {path} does not exist (a local model folder; a Hugging Face "
                          "name looks like org/name)")
    if cfg.rollout.overlap and (world := launched_world()) > 1:
        raise ConfigError(f"rollout.overlap={cfg.rollout.overlap} runs in one process for now (the sampler copy "
                          f"is not sharded), this launch starts {world}: set rollout.overlap=0, or train as one "
                          "process")


def check_context(cfg: ExGRPOConfig) -> None:
    """Prompt + response tokens (sampling and evaluation) must fit the policy's positions, after
    `model.hf_overrides`: vLLM refuses a longer `max_model_len`, and the trainer would run RoPE past the
    lengths the model knows. One line, read from the model's config alone (before any weights load).
    The run's name, numbers and model path are checked first (`check_settings`)."""
    check_settings(cfg)
    try:
        config = models.policy_config(cfg.model.name_or_path, tiny=cfg.model.tiny.model_dump(),
                                      hf_overrides=cfg.model.hf_overrides)
    except models.ModelLoadError as e:
        raise ConfigError(str(e)) from None
    limit = getattr(config, "max_position_embeddings", None)
    response = max(cfg.rollout.max_response_tokens, cfg.eval.max_response_tokens or 0)
    need = cfg.rollout.max_prompt_tokens + response
    if limit is not None and need > limit:
        raise ConfigError(
            f"rollout.max_prompt_tokens + the longest response ({cfg.rollout.max_prompt_tokens} + {response} = "
            f"{need} tokens) exceed {cfg.model.name_or_path}'s max_position_embeddings ({limit}): use a "
            "longer-context model (the paper's: Elliott/Qwen2.5-Math-7B-16k-think), shorter limits, or "
            "model.hf_overrides")
