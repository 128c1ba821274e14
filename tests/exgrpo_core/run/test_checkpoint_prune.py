"""Checkpoint folders are named by the steps completed (the progress line's count), and
run.keep_checkpoints prunes only older checkpoints, only once a newer one is complete."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from exgrpo_core.config.load import load_config
from exgrpo_core.models.load import load_policy
from exgrpo_core.run import checkpoint
from exgrpo_core.run.session import open_session

TINY = dict(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64)


def _save(run_dir: Path, step: int, keep: int) -> Path:
    model, tok = load_policy("tiny", tiny=TINY, seed=step)
    return checkpoint.save_checkpoint(run_dir, step, model, tok, torch.optim.AdamW(model.parameters()),
                                      {"run_id": "r"}, keep=keep)


def _names(run_dir: Path) -> list[str]:
    return sorted(p.name for p in checkpoint.checkpoint_dir(run_dir).iterdir())


def test_a_folder_counts_completed_steps_and_holds_the_last_step_index(tmp_path):
    ckpt = _save(tmp_path, 3, keep=2)  # 0-based step 3 is the progress line's `step 4/N`
    assert ckpt.name == "step_000004" == checkpoint.folder_name(3)
    assert checkpoint.load_trainer_state(ckpt)["step"] == 3


def test_keep_prunes_the_oldest_after_the_new_one_is_written(tmp_path):
    for step in range(4):
        _save(tmp_path, step, keep=2)
    assert _names(tmp_path) == ["step_000003", "step_000004"]
    _save(tmp_path, 4, keep=1)
    assert _names(tmp_path) == ["step_000005"]
    assert checkpoint.latest_checkpoint(tmp_path).name == "step_000005"


def test_a_failed_write_prunes_nothing(tmp_path, monkeypatch):
    _save(tmp_path, 1, keep=1)
    monkeypatch.setattr(checkpoint, "write_manifest", lambda folder: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        _save(tmp_path, 3, keep=1)
    assert _names(tmp_path) == [".tmp_step_000004", "step_000002"]  # the old one stays, the new is not renamed
    assert checkpoint.resume_point(tmp_path).name == "step_000002"
    monkeypatch.undo()
    _save(tmp_path, 4, keep=1)  # a later one is complete: the older checkpoint and interrupted write go
    assert _names(tmp_path) == ["step_000005"]


def test_a_new_checkpoint_that_does_not_match_its_manifest_prunes_nothing(tmp_path, monkeypatch):
    _save(tmp_path, 0, keep=1)
    real = checkpoint.write_manifest

    def short(folder):  # the manifest is written, then a file loses bytes before the rename
        m = real(folder)
        with open(Path(folder) / "model.safetensors", "r+b") as f:
            f.truncate(10)
        return m

    monkeypatch.setattr(checkpoint, "write_manifest", short)
    with pytest.warns(UserWarning, match="step_000002 is incomplete after writing .*no older checkpoint removed"):
        _save(tmp_path, 1, keep=1)
    assert _names(tmp_path) == ["step_000001", "step_000002"]


def test_newer_folders_and_other_names_are_never_pruned(tmp_path):
    _save(tmp_path, 8, keep=1)  # e.g. left by another process: newer than the one written next
    (checkpoint.checkpoint_dir(tmp_path) / ".damaged_step_000003").mkdir()
    (checkpoint.checkpoint_dir(tmp_path) / "step_notes").mkdir()
    _save(tmp_path, 1, keep=1)
    assert _names(tmp_path) == [".damaged_step_000003", "step_000002", "step_000009", "step_notes"]


def test_a_resumed_run_keeps_its_checkpoint_until_a_newer_one_is_complete(tmp_path):
    cfg = load_config("tiny", [f"run.output_dir={tmp_path}", f"run.db_url=sqlite:///{tmp_path / 'x.db'}",
                               "run.keep_checkpoints=1"])
    never = lambda texts, answers: [(0.0, "wrong")] * len(texts)  # noqa: E731
    s = open_session(cfg, verify=never)
    s.step = 2  # two steps completed
    s.store.update_run(s.run_id, step=1)  # as the step's log does before its checkpoint
    s.save()
    s.close()
    s = open_session(cfg, verify=never)
    try:
        assert (s.resumed_from, s.step) == (1, 2) and _names(s.run_dir) == ["step_000002"]
        s.step = 4
        s.save()
        assert _names(s.run_dir) == ["step_000004"]
    finally:
        s.close()
