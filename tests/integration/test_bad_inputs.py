"""Bad inputs end in one early line (issue 35, item 7): `exgrpo train` with each one exits 2 with a single
`error:` line naming the problem, no traceback, before Prefect starts (here it is out of reach, so
anything later would fail differently) and with no run folder or database row left behind."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
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
    deep = tmp / "deep.jsonl"
    deep.write_text('{"question": "1+1=", "answer": "2", "x": ' + "[" * 200_000 + "]" * 200_000 + "}\n")
    models = _model_folders(tmp)
    (tmp / "a-file").write_text("not a folder\n")
    other = sqlite3.connect(tmp / "other-app.db")
    other.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
    other.commit()
    other.close()
    return {
        **{f"model folder: {k}": [f"model.name_or_path={v}"] for k, v in models.items()},
        "hub model name while offline": ["model.name_or_path=nosuchorg/nosuchmodel"],
        "run.output_dir a file": [f"run.output_dir={tmp / 'a-file'}"],
        "run.output_dir under /proc": ["run.output_dir=/proc/exgrpo-runs"],
        "rollout.engine=vllm without vLLM": ["rollout.engine=vllm"],
        "rollout.engine=remote without vLLM": ["rollout.engine=remote", "rollout.server_url=http://127.0.0.1:9"],
        "garbage MLflow URI": ["run.mlflow_tracking_uri=garbage"],
        "tiny.num_heads=3": ["model.tiny.num_heads=3"],
        "200k-deep JSON row": [f"data.train_path={deep}"],
        "another application's database": [f"run.db_url=sqlite:///{tmp / 'other-app.db'}"],
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


def _model_folders(tmp: Path) -> dict[str, Path]:
    """A file, an empty folder, and copies of a real model folder with a corrupt config.json, no weights,
    truncated weights."""
    from exgrpo_core.models.build import build_tiny_model, build_tiny_tokenizer, save_policy

    good = tmp / "model-good"
    tok = build_tiny_tokenizer()
    save_policy(build_tiny_model(tok), tok, good)
    out = {"a file": tmp / "model-file", "an empty folder": tmp / "model-empty"}
    out["a file"].write_text("weights?\n")
    out["an empty folder"].mkdir()
    for name, damage in (("corrupt config.json", lambda d: (d / "config.json").write_text('{"model_type": ')),
                         ("no weights", lambda d: (d / "model.safetensors").unlink()),
                         ("truncated weights", lambda d: (d / "model.safetensors").write_bytes(
                             (good / "model.safetensors").read_bytes()[:4096]))):
        folder = tmp / f"model-{name.replace(' ', '-')}"
        shutil.copytree(good, folder)
        damage(folder)
        out[name] = folder
    return out


def _rows_text(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def _train(tmp: Path, sets: list[str]) -> tuple[int, str]:
    args = [sys.executable, "-m", "flows.cli", "train", "--config", "tiny"]
    for s in [f"run.output_dir={tmp / 'runs'}", f"run.db_url=sqlite:///{tmp / 'exp.db'}", "run.steps=1",
              f"run.name=bad-{os.getpid()}", f"run.mlflow_tracking_uri=sqlite:///{tmp / 'mlflow.db'}", *sets]:
        args += ["--set", s]
    env = {**os.environ, "PREFECT_API_URL": "http://127.0.0.1:9/api", "PREFECT_HOME": str(tmp / "ph"),
           "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp / "hf")}
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    return proc.returncode, proc.stdout + proc.stderr


def one_early_line(rc: int, out: str) -> bool:
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    return rc == 2 and len(errors) == 1 and "Traceback" not in out and "Prefect" not in out.split("error:")[0]


NAMED = {  # what the one line must name
    "model folder: a file": "is a file, not a model folder", "model folder: an empty folder": "is empty",
    "model folder: corrupt config.json": "config.json is not readable JSON",
    "model folder: no weights": "has no weights", "model folder: truncated weights": "is truncated",
    "hub model name while offline": "not in the local Hugging Face cache",
    "run.output_dir a file": "is a file, not a folder", "run.output_dir under /proc": "cannot hold runs",
    "rollout.engine=vllm without vLLM": "rollout.engine=vllm needs vLLM",
    "rollout.engine=remote without vLLM": "rollout.engine=remote needs vLLM",
    "garbage MLflow URI": "'garbage' is not a tracking URI", "tiny.num_heads=3": "multiple of model.tiny.num_heads",
    "200k-deep JSON row": "line 1: JSON nested too deeply", "another application's database":
    "another application's tables (customers)",
}
CASES = [*NAMED, "non-UTF-8 data file", "lone surrogate in a question", "NUL in a question on PostgreSQL", "missing model path",
         "no parseable gold answer", "zero-size tiny model", "lr=inf", "5 MB prompt",
         "run.name escaping the output folder"]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_ends_in_one_early_line(case, tmp_path):
    rc, out = _train(tmp_path, _bad_inputs(tmp_path)[case])
    assert one_early_line(rc, out), f"{case}: rc {rc}\n{out[-3000:]}"
    assert NAMED.get(case, "error:") in out, f"{case}: {out[-1000:]}"
    assert not (tmp_path / "runs" / f"bad-{os.getpid()}").exists()
