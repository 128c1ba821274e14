"""What `exgrpo train` prints: our lines only (no transformers deprecation warnings or tqdm bars), the
final evaluation's progress, checkpoint folders numbered as the progress lines count, pruned to
run.keep_checkpoints. Two short tiny runs through the real CLI: the second resumes (loads weights)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from exgrpo_core.run.checkpoint import checkpoint_dir

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
NOISE = ("past_key_values", "is deprecated", "FutureWarning", "Loading weights", "Writing model shards", "it/s]")
EVAL = ["eval.final=true", "eval.suites=[bundled:tiny-arith]", "eval.max_questions=6", "eval.samples=2",
        "eval.max_response_tokens=1", "eval.batch_size=4"]


def _train(overrides: list[str]) -> str:
    args = [sys.executable, "-m", "flows.cli", "train", "--config", "tiny"]
    for o in overrides:
        args += ["--set", o]
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return out


def test_a_short_run_prints_its_own_lines_only(tmp_path, prefect_server, tiny_overrides):
    base = [*tiny_overrides, "run.name=quiet", "run.checkpoint_every=1", "run.keep_checkpoints=1", *EVAL]
    first = _train([*base, "run.steps=2"])
    folder = checkpoint_dir(tmp_path / "runs" / "quiet")
    assert "step    2/2 |" in first and sorted(p.name for p in folder.iterdir()) == ["step_000002"]
    second = _train([*base, "run.steps=3"])  # resumes: the checkpoint's weights are loaded from disk
    assert "after step 2 (checkpoint step_000002)" in second and "step    3/3 |" in second
    assert sorted(p.name for p in folder.iterdir()) == ["step_000003"]
    for out in (first, second):
        noise = [line for line in out.splitlines() if any(n in line for n in NOISE)]
        assert not noise, noise
    # the final evaluation (6 questions x 2 samples in chunks of 4 sequences): progress at most every 5 s,
    # and always its last line
    done = [int(n) for n in re.findall(r"eval step 3: (\d+)/6 questions, \d+ s", second)]
    assert done and done[-1] == 6 and done == sorted(done), done
