"""Bad inputs end in one early line (issue 35, item 7): `exgrpo train` with each one exits 2 with a single
`error:` line naming the problem, no traceback, before Prefect starts (here it is out of reach, so
anything later would fail differently) and with no run folder or database row left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PG_URL = os.environ.get("EXGRPO_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def _rows(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _bad_inputs(tmp: Path) -> dict[str, list[str]]:
    good = [{"question": f"{i}+1=", "answer": str(i + 1)} for i in range(4)]
    (tmp / "latin1.jsonl").write_bytes(b'{"question": "caf\xe9 1+1=", "answer": "2"}\n')
    (tmp / "surrogate.jsonl").write_text('{"question": "x \\ud800 1+1=", "answer": "2"}\n' + _rows_text(good))
    nul = _rows(tmp / "nul.jsonl", [{"question": "a\x00b", "answer": "1"}, *good])
    golds = _rows(tmp / "golds.jsonl", [{"question": "q", "answer": "$$"}, {"question": "r", "answer": "\\boxed{"}])
    long = _rows(tmp / "long.jsonl", [{"question": "x" * 5_000_000, "answer": "1"}, *good])
    return {
        "non-UTF-8 data file": [f"data.train_path={tmp / 'latin1.jsonl'}"],
        "lone surrogate in a question": [f"data.train_path={tmp / 'surrogate.jsonl'}"],
        "NUL in a question on PostgreSQL": [f"data.train_path={nul}", f"run.db_url={PG_URL}"],
        "missing model path": [f"model.name_or_path={tmp / 'no-such-model'}"],
        "no parseable gold answer": [f"data.train_path={golds}"],
        "zero-size tiny model": ["model.tiny.hidden_size=0"],
        "lr=inf": ["train.lr=inf"],
        "5 MB prompt": [f"data.train_path={long}"],
        "run.name escaping the output folder": ["run.name=../escape"],
    }


def _rows_text(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def _train(tmp: Path, sets: list[str]) -> tuple[int, str]:
    args = [sys.executable, "-m", "flows.cli", "train", "--config", "tiny"]
    for s in [f"run.output_dir={tmp / 'runs'}", f"run.db_url=sqlite:///{tmp / 'exp.db'}", "run.steps=1",
              f"run.name=bad-{os.getpid()}", f"run.mlflow_tracking_uri=sqlite:///{tmp / 'mlflow.db'}", *sets]:
        args += ["--set", s]
    env = {**os.environ, "PREFECT_API_URL": "http://127.0.0.1:9/api", "PREFECT_HOME": str(tmp / "ph")}
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    return proc.returncode, proc.stdout + proc.stderr


def one_early_line(rc: int, out: str) -> bool:
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    return rc == 2 and len(errors) == 1 and "Traceback" not in out and "Prefect" not in out.split("error:")[0]


CASES = ["non-UTF-8 data file", "lone surrogate in a question", "NUL in a question on PostgreSQL", "missing model path",
         "no parseable gold answer", "zero-size tiny model", "lr=inf", "5 MB prompt",
         "run.name escaping the output folder"]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_ends_in_one_early_line(case, tmp_path):
    rc, out = _train(tmp_path, _bad_inputs(tmp_path)[case])
    assert one_early_line(rc, out), f"{case}: rc {rc}\n{out[-3000:]}"
    assert not (tmp_path / "runs" / f"bad-{os.getpid()}").exists()
