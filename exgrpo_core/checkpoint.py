"""Resumable checkpoints: model + tokenizer, optimiser, RNG states, step and loop state.

Layout: `run_dir/checkpoints/step_000010/{model files, trainer_state.pt}` (FSDP2 adds `optimizer/`,
each process's optimiser shard in torch.distributed.checkpoint format; with sharded weights the model
files are config + tokenizer and `model/` holds each process's weight shard), written to a temporary
folder and renamed, so a kill mid-save never leaves a half checkpoint that looks complete. The
experience database is rolled back to the checkpoint's step on resume (`ExperienceStore.rollback_to`).
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Callable

import numpy as np
import torch

STATE_FILE = "trainer_state.pt"
OPTIMIZER_SHARDS = "optimizer"
MODEL_SHARDS = "model"


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint folder, or None."""
    root = checkpoint_dir(run_dir)
    done = sorted(p for p in root.glob("step_*") if (p / STATE_FILE).is_file()) if root.is_dir() else []
    return done[-1] if done else None


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(run_dir: str | Path, step: int, model, tokenizer, optimizer, loop_state: dict,
                    keep: int = 2, model_state: dict | None = None,
                    optimizer_shards: Callable[[Path], None] | None = None,
                    model_shards: Callable[[Path], None] | None = None) -> Path:
    """Write step `step` atomically and prune all but the `keep` newest checkpoints.

    `model_state`: the full model state gathered from sharded processes (fsdp.py), used instead of
    the model's own. `optimizer_shards(folder)` / `model_shards(folder)`: write the optimiser state /
    the weights as per-process shards (every process takes part); the state file then holds
    `optimizer: None`, and the folder the model's config instead of its weights."""
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    if model_shards is not None:
        model.config.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        model_shards(tmp / MODEL_SHARDS)
    else:
        model.save_pretrained(tmp, safe_serialization=True, state_dict=model_state)
    tokenizer.save_pretrained(tmp)
    if optimizer_shards is not None:
        optimizer_shards(tmp / OPTIMIZER_SHARDS)
    optim = None if optimizer_shards is not None else optimizer.state_dict()
    torch.save({"step": step, "optimizer": optim, "rng": rng_state(), "loop": loop_state}, tmp / STATE_FILE)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in sorted(p for p in root.glob("step_*") if p.is_dir())[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_trainer_state(path: str | Path) -> dict:
    """The optimiser / RNG / loop state saved beside the model weights."""
    return torch.load(Path(path) / STATE_FILE, map_location="cpu", weights_only=False)


def has_weight_shards(path: str | Path) -> bool:
    """Whether `path` is a checkpoint whose weights are per-process shards (run.checkpoint_weights=sharded)."""
    return (Path(path) / MODEL_SHARDS / ".metadata").is_file()
