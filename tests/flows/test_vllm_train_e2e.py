"""End to end through `exgrpo train` with rollout.engine=vllm (the stand-in for vLLM: fake_vllm.py),
sleep mode on and an evaluation after every step: the paper preset's shape of run, three steps.

Each evaluation samples in several chunks between a step's weight push and the next step's rollout;
a level-2 sleep after any chunk would discard the weights with no push to follow. The run must finish,
store every evaluation, and the engine must have slept after each rollout only, with a push before
every sampling that followed a sleep.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_helpers import sqlite_rows

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_vllm_engine_with_sleep_and_an_evaluation_every_step(tmp_path, prefect_server, tiny_overrides):
    events_file = tmp_path / "events.json"
    sets = [*tiny_overrides, "run.steps=3", "run.name=vllm-e2e", "rollout.engine=vllm", "rollout.vllm_sleep=true",
            "rollout.max_response_tokens=2", "eval.every=1", "eval.final=true", "eval.max_questions=6",
            "eval.batch_size=2"]
    proc = subprocess.run([sys.executable, "tests/flows/vllm_stand_in_cli.py", str(events_file), "train",
                           "--config", "configs/tiny.yaml", *sum((["--set", s] for s in sets), [])],
                          cwd=ROOT, env=dict(os.environ), capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "step    3/3" in out, out[-3000:]

    db = tmp_path / "exp.db"
    (run_id, status), = sqlite_rows(db, "select id, status from runs where name='vllm-e2e'")
    assert status == "finished"
    steps = sorted({r[0] for r in sqlite_rows(db, "select step from eval_results where run_id=:r", r=run_id)})
    assert steps == [0, 1, 2], steps  # one evaluation per step (the final one is step 2's)

    events, = json.loads(events_file.read_text())  # one engine
    gens = [i for i, e in enumerate(events) if e.startswith("generate(")]
    assert len(gens) >= 3 + 3 * 3, events  # 3 rollouts, 3 evaluations of 6 questions in chunks of 2
    for i in gens:  # every sampling after a sleep has the weights pushed back first
        before = events[:i]
        if "sleep(2)" in before:
            last_sleep = len(before) - 1 - before[::-1].index("sleep(2)")
            assert "exgrpo_load_weights" in before[last_sleep:], (i, events)
    sleeps = [i for i, e in enumerate(events) if e == "sleep(2)"]
    assert len(sleeps) == 3, events  # after each step's rollout, never after an evaluation's chunk
