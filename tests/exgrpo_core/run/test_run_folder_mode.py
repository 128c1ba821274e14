"""A run folder is its user's only: created 0700 (an older one made 0700 again), and what the run writes in
it (database, lock files, checkpoints) 0600, as the services' state folder; the umask is given back."""

from __future__ import annotations

import os
import stat

from exgrpo_core import loop
from exgrpo_core.config.load import load_config
from exgrpo_core.run import locks
from exgrpo_core.run.session import open_session


def _modes(folder):
    out = {folder: stat.S_IMODE(folder.stat().st_mode)}
    for p in folder.rglob("*"):
        out[p] = stat.S_IMODE(p.lstat().st_mode)
    return out


def test_a_runs_folder_and_files_are_private(tmp_path):
    (tmp_path / "old").mkdir(mode=0o755)  # a run folder made before, readable by everyone
    (tmp_path / "old").chmod(0o755)
    before = os.umask(0o022)
    try:
        for name in ("new", "old"):
            cfg = load_config("tiny", [f"run.output_dir={tmp_path}", f"run.name={name}", "rollout.max_response_tokens=3",
                                       "rollout.group_size=2", "train.batch_size=2", "train.mini_batch_size=2"])
            s = open_session(cfg, verify=lambda texts, answers: [(1.0, "correct")] * len(texts))
            try:
                loop.run_iteration(s)
                s.save()
            finally:
                s.close()
            modes = _modes(tmp_path / name)
            assert any(p.suffix == ".db" for p in modes) and any("checkpoint" in str(p) for p in modes), modes
            wrong = {str(p): oct(m) for p, m in modes.items() if m != (0o700 if p.is_dir() else 0o600)}
            assert not wrong, wrong
            assert os.umask(0o022) == 0o022  # given back when the run closed
            assert not locks.holds(tmp_path / name)
    finally:
        os.umask(before)
