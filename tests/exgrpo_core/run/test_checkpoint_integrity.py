"""Checkpoint integrity: a manifest of sizes and hashes, fsync before the rename, verification on resume
with a fall-back to the newest intact checkpoint, or one line naming the damaged folder."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from exgrpo_core.config.load import load_config
from exgrpo_core.models.load import load_policy
from exgrpo_core.run import checkpoint
from exgrpo_core.run.session import open_session

TINY = dict(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64)


def _save(run_dir: Path, step: int, keep: int = 3) -> Path:
    model, tok = load_policy("tiny", tiny=TINY, seed=step)
    opt = torch.optim.AdamW(model.parameters())
    return checkpoint.save_checkpoint(run_dir, step, model, tok, opt, {"run_id": "r"}, keep=keep)


def _truncate(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)


def test_manifest_lists_every_file_with_size_and_hash(tmp_path):
    ckpt = _save(tmp_path, 3)
    files = json.loads((ckpt / checkpoint.MANIFEST).read_text())["files"]
    on_disk = {str(p.relative_to(ckpt)) for p in ckpt.rglob("*") if p.is_file()} - {checkpoint.MANIFEST}
    assert set(files) == on_disk and {"model.safetensors", checkpoint.STATE_FILE} <= on_disk
    assert files["model.safetensors"]["size"] == (ckpt / "model.safetensors").stat().st_size
    assert checkpoint.verify_checkpoint(ckpt) is None
    (ckpt / "config.json").write_text("{}")  # same folder, other content
    assert "config.json" in checkpoint.verify_checkpoint(ckpt)


def test_files_and_folders_are_fsynced_before_the_rename(tmp_path, monkeypatch):
    events: list[tuple[str, str]] = []
    real_fsync, real_rename = os.fsync, Path.rename
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))),
                                                 real_fsync(fd))[1])
    monkeypatch.setattr(Path, "rename", lambda self, to: (events.append(("rename", str(self))),
                                                          real_rename(self, to))[1])
    ckpt = _save(tmp_path, 7)  # after 0-based step 7: 8 steps completed
    tmp = str(ckpt.with_name(".tmp_step_000008"))
    renamed = events.index(("rename", tmp))
    synced_before = {p for kind, p in events[:renamed] if kind == "fsync"}
    for p in ckpt.rglob("*"):
        assert str(p).replace(str(ckpt), tmp) in synced_before, f"{p.name} not fsynced before the rename"
    assert tmp in synced_before
    assert ("fsync", str(ckpt.parent)) in events[renamed:], "the parent folder is not fsynced after the rename"


@pytest.mark.parametrize("victim", ["model.safetensors", checkpoint.STATE_FILE])
def test_resume_skips_a_damaged_latest_checkpoint_with_a_warning(tmp_path, victim):
    old, new = _save(tmp_path, 1), _save(tmp_path, 2)
    _truncate(new / victim)
    with pytest.warns(UserWarning, match=f"checkpoint {new} is damaged \\({victim} has"):
        assert checkpoint.resume_point(tmp_path) == old
    assert not new.exists() and (new.parent / ".damaged_step_000003").is_dir()


def test_no_intact_checkpoint_is_one_line_naming_the_path(tmp_path):
    only = _save(tmp_path, 4)
    _truncate(only / checkpoint.STATE_FILE)
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.resume_point(tmp_path)
    msg = str(e.value)
    assert str(only) in msg and "no older intact checkpoint" in msg and "run.name" in msg and "\n" not in msg


def test_session_resumes_from_the_older_checkpoint_when_the_latest_is_truncated(tmp_path):
    cfg = load_config("tiny", [f"run.output_dir={tmp_path}", f"run.db_url=sqlite:///{tmp_path / 'x.db'}"])
    never = lambda texts, answers: [(0.0, "wrong")] * len(texts)  # noqa: E731
    s = open_session(cfg, verify=never)
    for step in (1, 2):
        s.step = step
        s.store.update_run(s.run_id, step=step - 1)  # as the step's log does before its checkpoint
        s.save()
    s.close()
    _truncate(s.run_dir / "checkpoints" / "step_000002" / "model.safetensors")  # the latest: 2 steps done
    with pytest.warns(UserWarning, match="step_000002 is damaged"):
        s2 = open_session(cfg, verify=never)
    try:
        assert s2.resumed_from == 0 and s2.step == 1
    finally:
        s2.close()


def test_a_deleted_manifest_does_not_turn_the_checks_off(tmp_path):
    """Issue 35 item 7: deleting manifest.json made a checkpoint look older than manifests, so corrupt
    weights loaded silently; a checkpoint written with one is now damaged without it."""
    older, latest = _save(tmp_path, 1), _save(tmp_path, 2)
    (latest / checkpoint.MANIFEST).unlink()
    _truncate(latest / "model.safetensors")
    assert checkpoint.verify_checkpoint(latest) == f"{checkpoint.MANIFEST} is missing"
    with pytest.warns(UserWarning, match="step_000003 is damaged"):
        assert checkpoint.resume_point(tmp_path) == older
    state = torch.load(older / checkpoint.STATE_FILE, weights_only=False)
    del state["manifest"]  # a checkpoint from before manifests: still accepted without one
    torch.save(state, older / checkpoint.STATE_FILE)
    (older / checkpoint.MANIFEST).unlink()
    assert checkpoint.verify_checkpoint(older) is None
