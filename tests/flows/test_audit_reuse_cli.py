"""The CLI of issue 17's parts 3 and 4: `exgrpo reverify` prints a table and writes a JSON report,
changing nothing without --apply; bad input (an unknown run, an unknown warm-start source) is one line,
exit 2, before Prefect or a model starts."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from exgrpo_core import loop
from exgrpo_core.config.load import load_config
from exgrpo_core.run.session import open_session
from exgrpo_core.store.experience_store import ExperienceStore

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def _cli(*args):
    proc = subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "COLUMNS": "400"})
    return proc.returncode, proc.stdout + proc.stderr


def test_unknown_warm_start_source_is_one_line_before_prefect(tmp_path, tiny_overrides):
    args = ["train", "--config", "tiny"]
    for o in [*tiny_overrides[:1], "run.name=fresh", "run.steps=1", "buffer.warm_start=nope"]:
        args += ["--set", o]
    code, out = _cli(*args)
    assert code == 2 and "error: buffer.warm_start: no run 'nope'" in out, out
    assert "Prefect" not in out and "Traceback" not in out
    assert not (tmp_path / "runs" / "fresh").exists()  # a failed start leaves no run folder


def test_reverify_prints_disagreements_and_writes_the_report(tmp_path):
    cfg = load_config("tiny", [f"run.output_dir={tmp_path}", "run.name=graded", "run.steps=2"])
    lenient = lambda texts, answers: [(1.0, "correct")] * len(texts)  # noqa: E731 - every response rewarded
    s = open_session(cfg, verify=lenient)
    for _ in range(2):
        loop.run_iteration(s)
    run_id = s.run_id
    s.close()
    url = f"sqlite:///{tmp_path / 'graded' / 'experience.db'}"
    with ExperienceStore(url) as st:
        stored = st.stored_trajectories(run_id)
    wrong = [r for r in stored if r["text"].strip() != r["answer"]]  # the real verifier rejects these
    assert wrong
    code, out = _cli("reverify", "--db-url", url, "--run", "graded", "--out", str(tmp_path / "r.json"))
    assert code == 0, out
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["summary"]["trajectories"] == len(stored)
    assert {d["trajectory_id"] for d in report["disagreements"]} == {r["id"] for r in wrong}
    assert f"{len(wrong)} of {len(stored)} stored rewards disagree" in out and "stored rewards unchanged" in out
    with ExperienceStore(url) as st:
        assert st.stored_trajectories(run_id) == stored and st.reward_changes(run_id) == []
    code, out = _cli("reverify", "--db-url", url, "--run", "nope")
    assert code == 2 and out.strip().splitlines() == [f"error: no run 'nope' (by name or id) in the experience "
                                                      f"database at {url}"], out
