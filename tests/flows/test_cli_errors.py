"""Bad input through the CLI: one clear line naming the problem, exit code 2, nothing stored lost."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def _train(tiny_overrides, *extra):
    """Run the real CLI in a subprocess (Prefect's log handlers outlive pytest's captured streams)."""
    args = [sys.executable, "-m", "flows.cli", "train", "--config", "tiny"]
    for o in [*tiny_overrides, "run.steps=1", *extra]:
        args += ["--set", o]
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


def test_unknown_config_key_is_named(tiny_overrides):
    code, out = _train(tiny_overrides, "rollout.temprature=0.7")
    assert code == 2 and "rollout.temprature: unknown key" in out


def test_bad_database_url_is_named(tiny_overrides, prefect_server):
    code, out = _train(tiny_overrides, "run.db_url=foo://nowhere/db")
    assert code == 2 and "foo://nowhere/db" in out.replace("\n", "")


def test_unreachable_mlflow_server_is_named(tiny_overrides, prefect_server):
    code, out = _train(tiny_overrides, "run.mlflow_tracking_uri=http://127.0.0.1:9")
    flat = out.replace("\n", "")
    assert code == 2 and "http://127.0.0.1:9" in flat and "unreachable" in flat


def test_malformed_dataset_row_is_named_and_existing_experience_kept(tmp_path, tiny_overrides,
                                                                       prefect_server):
    assert _train(tiny_overrides, "run.name=keep")[0] == 0
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "1+1", "answer": "2"}\n{"question": "2+2"}\n')
    code, out = _train(tiny_overrides, "run.name=keep", "run.steps=2", f"data.train_path={bad}")
    flat = out.replace("\n", "")
    assert code == 2 and "bad.jsonl" in flat and "line 2" in flat and "answer" in flat
    import sqlalchemy as sa

    eng = sa.create_engine(f"sqlite:///{tmp_path / 'exp.db'}")
    with eng.connect() as c:
        assert c.execute(sa.text("select count(*) from group_results")).scalar() == 8
        assert c.execute(sa.text("select status from runs where name='keep'")).scalar() == "finished"
    eng.dispose()


def test_commands_other_than_train_refuse_several_processes():
    import os

    proc = subprocess.run([sys.executable, "-m", "flows.cli", "compare", "--config", "tiny"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "WORLD_SIZE": "2"})
    out = (proc.stdout + proc.stderr).replace("\n", " ")
    assert proc.returncode == 2 and "only `exgrpo train` runs in several processes" in out


def test_second_train_on_the_same_run_is_refused_naming_the_first(tmp_path, tiny_overrides, prefect_server):
    import os
    import signal
    import time

    args = [sys.executable, "-m", "flows.cli", "train", "--config", "tiny"]
    for o in [*tiny_overrides, "run.steps=1000", "run.name=twice"]:
        args += ["--set", o]
    first = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    try:
        lock = tmp_path / "runs" / "twice" / ".lock"
        deadline = time.time() + 120
        while not (lock.is_file() and lock.read_text()) and time.time() < deadline:
            assert first.poll() is None
            time.sleep(0.2)
        proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120)
        out = (proc.stdout + proc.stderr).replace("\n", " ")
        assert proc.returncode == 2, out[-2000:]
        assert f"run 'twice' is already running (pid {first.pid} on" in out and "Traceback" not in out
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()


def _train_without_prefect(tmp_path, tiny_overrides, *extra, env=None):
    """The CLI with Prefect out of reach: an error found before Prefect starts is the only output."""
    import os

    args = [sys.executable, "-m", "flows.cli", "train", "--config", "tiny"]
    for o in [*tiny_overrides, "run.steps=1", "run.name=early", *extra]:
        args += ["--set", o]
    env = {**os.environ, "PREFECT_API_URL": "http://127.0.0.1:9/api", "PREFECT_HOME": str(tmp_path / "ph"),
           **(env or {})}
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.parametrize("override, named", [
    ("data.train_path=/nonexistent/train.jsonl", "/nonexistent/train.jsonl"),
    ("run.db_url=postgresql+psycopg://postgres@127.0.0.1:9/x", "127.0.0.1:9")])
def test_user_errors_are_found_before_prefect_starts(tmp_path, tiny_overrides, override, named):
    code, out = _train_without_prefect(tmp_path, tiny_overrides, override)
    assert code == 2 and named in out.replace("\n", "") and "Traceback" not in out, out[-2000:]
    assert out.count("error") == 1 and not (tmp_path / "runs" / "early").exists()


def test_a_prefect_start_up_timeout_is_one_line_saying_how_to_fix_it(tmp_path, tiny_overrides):
    code, out = _train_without_prefect(tmp_path, tiny_overrides, env={
        "PREFECT_API_URL": "", "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "1"})
    flat = out.replace("\n", " ")
    assert code == 2 and "Traceback" not in out, out[-3000:]
    assert "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS" in flat and "PREFECT_API_URL" in flat


def test_preflight_accepts_the_default_database_in_a_new_run_folder(tmp_path):
    """The first README command: no run.db_url, nothing on disk yet (the default SQLite file lives in the
    run folder the run is about to create); a user's SQLite URL in a missing folder is still refused."""
    from exgrpo_core.config.load import load_config
    from exgrpo_core.store.engine import StoreError
    from flows.cli import _preflight

    cfg = load_config("tiny", [f"run.output_dir={tmp_path / 'fresh' / 'runs'}", "run.resume=never"])
    assert cfg.run.db_url is None
    run_dir = tmp_path / "fresh" / "runs" / cfg.run.name
    _preflight(cfg, run_dir)
    assert run_dir.is_dir()
    bad = load_config("tiny", [f"run.output_dir={tmp_path / 'b'}", f"run.db_url=sqlite:///{tmp_path}/no/such/x.db"])
    with pytest.raises(StoreError, match="folder does not exist"):
        _preflight(bad, tmp_path / "b" / bad.run.name)


def test_a_context_longer_than_the_model_allows_is_named_before_prefect(tiny_overrides):
    code, out = _train(tiny_overrides, "rollout.max_prompt_tokens=1024", "rollout.max_response_tokens=1100")
    lines = [x for x in out.splitlines() if x.strip()]
    assert code == 2 and "1024 + 1100 = 2124" in out and "max_position_embeddings (2048)" in out
    assert not any("Prefect" in x for x in lines) and len(lines) == 1  # one line, before Prefect starts


def test_overlap_under_several_processes_is_one_line_before_prefect(tmp_path, tiny_overrides):
    code, out = _train_without_prefect(tmp_path, tiny_overrides, "rollout.overlap=1", env={"WORLD_SIZE": "2"})
    lines = [x for x in out.splitlines() if x.strip()]
    assert code == 2 and "Traceback" not in out, out[-2000:]
    assert "rollout.overlap=1 runs in one process" in out.replace("\n", " ") and "starts 2" in out
    assert not any("Prefect" in x for x in lines) and not (tmp_path / "runs" / "early").exists()
