"""Resumable checkpoints: model + tokenizer, optimiser, RNG states, step and loop state.

Layout: `run_dir/checkpoints/step_000010/{model files, trainer_state.pt}` (FSDP2 adds `optimizer/`,
each process's optimiser shard in torch.distributed.checkpoint format; with sharded weights the model
files are config + tokenizer and `model/` holds each process's weight shard), written to a temporary
folder and renamed, so a kill mid-save never leaves a half checkpoint that looks complete. The
experience database is rolled back to the checkpoint's step on resume (`ExperienceStore.rollback_to`).

Numbering: a folder is named by its step number, the steps completed (metrics.step_number), as the CLI's
progress line and MLflow count (`step 4/4` -> `step_000004`, MLflow step 4); `trainer_state.pt` keeps the
0-based index of its last step (3 here), the step the experience database stores it at.

Pruning (`run.keep_checkpoints`): only after a new checkpoint is renamed into place, fsynced and its
files checked against its manifest, and only folders older than it: the checkpoint a run resumed
from stays until a newer one is complete, and a failed write removes nothing.

Integrity: `manifest.json` lists every file's size and SHA-256; files and folders are fsynced before
the rename (and the parent after it), so a power loss cannot leave a renamed folder with unwritten
data. On resume `resume_point` verifies the manifest and falls back to the newest intact checkpoint
(the damaged one is moved aside to `.damaged_step_N`), or stops with one line naming the path.

Async (`run.async_checkpoint`, FSDP2): the shards are copied to CPU memory and written by a background
thread (dcp.async_save) while training goes on; the folder stays `.tmp_step_N` until `finish_pending`
has waited for the writes, then manifest, fsync and rename follow as above. A kill before that leaves
only the temporary folder, which a resume never reads and a later checkpoint removes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import warnings
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from exgrpo_core import metrics as M
from exgrpo_core.run import disk_space

STATE_FILE = "trainer_state.pt"
OPTIMIZER_SHARDS = "optimizer"
MODEL_SHARDS = "model"
MANIFEST = "manifest.json"


class CheckpointError(RuntimeError):
    """No intact checkpoint to resume from; the message names the damaged folder and what to do."""


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


@contextlib.contextmanager
def no_progress_bars():
    """transformers' tqdm bars ("Loading weights", "Writing model shards") off meanwhile, so a run's log
    holds its own lines; restored afterwards (hub downloads outside this block keep theirs)."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def folder_name(step: int) -> str:
    """The folder of the checkpoint taken after 0-based step `step`: named by its step number (steps completed)."""
    return f"step_{M.step_number(step):06d}"


def _number(path: Path) -> int:
    """N of a `step_N` or `.tmp_step_N` folder (-1 for other names)."""
    digits = path.name.removeprefix(".tmp_").removeprefix("step_")
    return int(digits) if digits.isdigit() and path.name.removeprefix(".tmp_").startswith("step_") else -1


def _folders(root: Path, prefix: str = "step_") -> list[Path]:
    """The `step_N` folders (`.tmp_step_N`: interrupted writes) in `root`, oldest first."""
    found = [p for p in root.glob(f"{prefix}*") if p.is_dir() and _number(p) >= 0] if root.is_dir() else []
    return sorted(found, key=_number)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint folder, or None."""
    root = checkpoint_dir(run_dir)
    done = [p for p in _folders(root) if (p / STATE_FILE).is_file()]
    return done[-1] if done else None


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


_PENDING: dict[Path, tuple[Path, Path, int, Callable[[], None], Callable[[], None] | None]] = {}


def save_checkpoint(run_dir: str | Path, step: int, model, tokenizer, optimizer, loop_state: dict,
                    keep: int = 2, model_state: dict | None = None,
                    optimizer_shards: Callable[[Path], None] | None = None,
                    model_shards: Callable[[Path], None] | None = None,
                    background: Callable[[], None] | None = None,
                    before_commit: Callable[[], None] | None = None) -> Path:
    """Write the checkpoint after 0-based step `step` atomically (folder `folder_name(step)`), then
    prune older checkpoints down to the `keep` newest (module docstring: when and what).

    `model_state`: the full model state gathered from sharded processes (fsdp.py), used instead of
    the model's own. `optimizer_shards(folder)` / `model_shards(folder)`: write the optimiser state /
    the weights as per-process shards (every process takes part); the state file then holds
    `optimizer: None`, and the folder the model's config instead of its weights.
    `background`: the shard writers returned before their files were written (run.async_checkpoint) and
    this waits for them: the checkpoint stays `.tmp_step_N` and is completed by `finish_pending` (the
    next save calls it first); returns the folder it will have.
    `before_commit()`: runs once the files are written and hashed, just before the rename that makes the
    checkpoint count, so what it records about the step is never missing from a resumable checkpoint."""
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    finish_pending(run_dir)  # at most one checkpoint in flight, completed in order
    final = root / folder_name(step)
    tmp = root / f".tmp_{final.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    last = latest_checkpoint(run_dir)
    needed = disk_space.folder_bytes(last) if last else None
    try:
        with no_progress_bars():
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
        torch.save({"step": step, "optimizer": optim, "rng": rng_state(), "loop": loop_state, "manifest": True},
                   tmp / STATE_FILE)  # "manifest": a missing manifest.json is damage, not an older checkpoint
        if background is not None:
            _PENDING[root] = (tmp, final, keep, background, before_commit)
            return final
        return _complete(root, tmp, final, keep, before_commit)
    except Exception as e:
        _raise_disk_full(e, tmp, needed)
        raise


def _raise_disk_full(e: Exception, tmp: Path, needed: int | None) -> None:
    """A write that failed for lack of space, in any of its forms (disk_space.py): the partial folder is
    removed (the previous checkpoint stays as it was) and one DiskFullError raised from `e`."""
    if not disk_space.is_disk_full(e, tmp.parent):
        return
    shutil.rmtree(tmp, ignore_errors=True)
    raise disk_space.disk_full(tmp.parent, needed, "the checkpoint", filename=tmp) from e  # free: after removal


def _complete(root: Path, tmp: Path, final: Path, keep: int, before_commit: Callable[[], None] | None = None) -> Path:
    write_manifest(tmp)  # sizes and hashes; every file and folder fsynced
    if before_commit is not None:
        before_commit()
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    _fsync_dir(root)  # the rename itself is durable
    prune_checkpoints(root, final, keep)
    return final


def finish_pending(run_dir: str | Path) -> Path | None:
    """Complete the run's checkpoint whose shards were written in the background: wait for the writes
    (a failed write raises, and the checkpoint never counts), then manifest, rename and prune as a
    blocking save does. Only then is it a `step_N` folder that `resume_point` may pick. None when none."""
    root = checkpoint_dir(run_dir)
    pending = _PENDING.pop(root, None)
    if pending is None:
        return None
    tmp, final, keep, wait, before_commit = pending
    try:
        wait()
        return _complete(root, tmp, final, keep, before_commit)
    except Exception as e:
        last = latest_checkpoint(run_dir)
        _raise_disk_full(e, tmp, disk_space.folder_bytes(last) if last else None)
        raise


def close_pending(run_dir: str | Path) -> Path | None:
    """`finish_pending` at a run's close: a failed background write is a warning naming the checkpoint (the
    run resumes from the one before), never an error over the one that may be ending the run."""
    try:
        return finish_pending(run_dir)
    except Exception as err:  # noqa: BLE001
        warnings.warn(f"checkpoint write in {checkpoint_dir(run_dir)} failed ({err}): it does not count; a resume "
                      "starts from the previous checkpoint", stacklevel=2)
        return None


def prune_checkpoints(root: Path, newest: Path, keep: int) -> list[Path]:
    """Remove the checkpoints older than `newest` beyond the `keep` newest (`newest` counted), and
    interrupted writes of older steps; nothing when `newest` does not match its manifest's sizes.
    Returns the removed folders."""
    problem = verify_checkpoint(newest, hashes=False)
    if problem is not None:
        warnings.warn(f"checkpoint {newest} is incomplete after writing ({problem}): no older checkpoint "
                      "removed", stacklevel=2)
        return []
    n = _number(newest)
    older = [p for p in _folders(root) if _number(p) < n]
    gone = older[:max(0, len(older) - (keep - 1))] + [p for p in _folders(root, ".tmp_step_") if _number(p) < n]
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone


def load_trainer_state(path: str | Path) -> dict:
    """The optimiser / RNG / loop state saved beside the model weights."""
    return torch.load(Path(path) / STATE_FILE, map_location="cpu", weights_only=False)


def has_weight_shards(path: str | Path) -> bool:
    """Whether `path` is a checkpoint whose weights are per-process shards (run.checkpoint_weights=sharded)."""
    return (Path(path) / MODEL_SHARDS / ".metadata").is_file()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(folder: str | Path) -> dict:
    """Write `folder/manifest.json` ({relative path: {size, sha256}} of every file), fsync every file and
    folder under `folder` (deepest first), and return the manifest."""
    folder = Path(folder)
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)
    manifest = {"files": {str(p.relative_to(folder)): {"size": p.stat().st_size, "sha256": _sha256(p)}
                          for p in files}}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    for p in [*files, folder / MANIFEST]:
        _fsync_file(p)
    for d in sorted((p for p in folder.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        _fsync_dir(d)
    _fsync_dir(folder)
    return manifest


def verify_checkpoint(folder: str | Path, hashes: bool = True) -> str | None:
    """None when `folder` matches its manifest (or predates manifests), else what is wrong, in words.
    `hashes=False` checks the files' presence and sizes only (a just-written checkpoint)."""
    folder = Path(folder)
    if not (folder / MANIFEST).is_file():
        if not (folder / STATE_FILE).is_file():
            return f"{STATE_FILE} is missing"
        try:  # written with a manifest (its state says so): the manifest was deleted, nothing can be checked
            written = torch.load(folder / STATE_FILE, map_location="cpu", weights_only=False, mmap=True).get("manifest")
        except Exception as err:  # noqa: BLE001 - an unreadable state is damage too
            return f"{STATE_FILE} is unreadable ({type(err).__name__})"
        return f"{MANIFEST} is missing" if written else None
    try:
        files = json.loads((folder / MANIFEST).read_text())["files"]
    except (ValueError, KeyError, TypeError):
        return f"{MANIFEST} is unreadable"
    for rel, want in files.items():
        p = folder / rel
        if not p.is_file():
            return f"{rel} is missing"
        size = p.stat().st_size
        if size != want["size"]:
            return f"{rel} has {size} bytes, the manifest says {want['size']}"
        if hashes and _sha256(p) != want["sha256"]:
            return f"{rel} does not match its SHA-256 in the manifest"
    return None


def resume_point(run_dir: str | Path) -> Path | None:
    """The newest intact checkpoint of the run (None when there is none at all).

    A damaged newer checkpoint is moved aside to `.damaged_step_N` with a warning naming it and what is
    wrong; when every checkpoint is damaged, CheckpointError names the newest and what to do.
    """
    root = checkpoint_dir(run_dir)
    found = _folders(root)
    damaged: list[tuple[Path, str]] = []
    for path in reversed(found):
        problem = verify_checkpoint(path)
        if problem is None:
            for bad, why in damaged:
                aside = bad.with_name(f".damaged_{bad.name}")
                shutil.rmtree(aside, ignore_errors=True)
                bad.rename(aside)
                warnings.warn(f"checkpoint {bad} is damaged ({why}): moved to {aside.name}, resuming from "
                              f"{path.name}", stacklevel=2)
            return path
        damaged.append((path, problem))
    if damaged:
        bad, why = damaged[0]
        raise CheckpointError(f"checkpoint {bad} is damaged ({why}) and no older intact checkpoint exists: "
                              f"remove {root} to restart this run from step 0, or set run.name to start a new run")
    return None
