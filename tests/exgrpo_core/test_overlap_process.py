"""rollout.overlap_sampler=process: the transformers engine's overlap sampler in a child process
gives the thread's samples for the same weights, checks the weights it holds, dies as one clear error, stops
with the session and with a killed trainer."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from exgrpo_core import loop
from exgrpo_core import metrics as M
from exgrpo_core.rollout.overlap import Prefetch, Sampler
from exgrpo_core.rollout.sampler_process import ProcessSampler, SamplerProcessError
from exgrpo_core.rollout.sync import EngineSyncError
from tests.exgrpo_core.test_loop_overlap import _cfg, _open, _run

KW = {"temperature": 1.0, "max_new_tokens": 6}


def _prompts(s, n=3):
    return [s.prompt_ids(u) for u in sorted(s.questions)[:n]]


def _gone(pid: int) -> bool:
    """No such process, or only its exit status left (a zombie its new parent has not reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _same(a, b) -> None:
    """Equal tokens and texts; log-probs and entropies equal but for MKL's last bit: without MKL_CBWR its GEMM
    kernels depend on the buffers' alignment (seen on AMD EPYC after an earlier session ran in the process)."""
    assert [[(g.response_ids, g.text) for g in gs] for gs in a] == [[(g.response_ids, g.text) for g in gs] for gs in b]
    for x, y in zip(sum(a, []), sum(b, [])):
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-5) and x.entropies == pytest.approx(y.entropies, abs=1e-5)


def test_the_process_samples_what_the_thread_samples_from_the_same_weights(tmp_path):
    s = _open(tmp_path, "run.resume=never")
    proc = ProcessSampler(s.engine, Prefetch)
    try:
        with torch.no_grad():  # weights the copies were not made from: each start loads the trainer's
            for p in s.engine.model.parameters():
                p.add_(0.01 * torch.randn_like(p))
        for seed in (1, 2):
            a = proc.start(s.engine.model, None, 0, _prompts(s), [4, 4, 3], seed, **KW).wait()
            b = Sampler(s.engine).start(s.engine.model, None, 0, _prompts(s), [4, 4, 3], seed, **KW).wait()
            _same(a, b)
        assert proc.version == 2
        assert a != proc.start(s.engine.model, None, 0, _prompts(s), [4, 4, 3], 3, **KW).wait()  # seeded
    finally:
        proc.close()
        s.close()
    assert proc.proc.exitcode == 0 and _gone(proc.proc.pid)


def test_a_copy_the_child_does_not_see_stops_the_run_in_one_line(tmp_path):
    s = _open(tmp_path, "run.resume=never")
    proc = ProcessSampler(s.engine, Prefetch)
    try:
        name = next(n for n in proc.shared if n.endswith("norm.weight"))
        proc.shared[name] = proc.shared[name].clone()  # the trainer's copy lands in memory the child does not share
        with torch.no_grad():
            dict(s.engine.model.named_parameters())[name].add_(1.0)
        job = proc.start(s.engine.model, None, 0, _prompts(s), [2, 2, 2], 1, **KW)
        with pytest.raises(EngineSyncError, match=f"weights differ from the trainer's after the copy .*e.g. {name}"):
            job.wait()
        proc.proc.join(timeout=10)
        assert not proc.proc.is_alive()  # it was sampling from weights that are not the trainer's
    finally:
        proc.close()
        s.close()


def test_a_child_that_dies_is_one_error_naming_it_not_a_hang(tmp_path):
    s = _open(tmp_path, "run.resume=never")
    proc = ProcessSampler(s.engine, Prefetch)
    try:
        proc.start(s.engine.model, None, 0, _prompts(s), [2, 2, 2], 1, **KW).wait()  # started and sampled once
        job = proc.start(s.engine.model, None, 0, _prompts(s, 6), [4] * 6, 1, temperature=1.0, max_new_tokens=400)
        os.kill(proc.proc.pid, signal.SIGKILL)
        with pytest.raises(SamplerProcessError, match=f"process \\(pid {proc.proc.pid}\\) died \\(exit code -9\\)"):
            job.wait()
        assert "\n" not in str(job.error)
        with pytest.raises(SamplerProcessError, match="died \\(exit code -9\\)"):  # and at the next start
            proc.start(s.engine.model, None, 0, _prompts(s), [2, 2, 2], 1, **KW)
    finally:
        proc.close()
        s.close()


def test_the_sessions_close_stops_the_child(tmp_path):
    s = _open(tmp_path, "rollout.overlap=1", "rollout.overlap_sampler=process", "run.resume=never")
    try:
        loop.run_iteration(s)
        out = loop.run_iteration(s)  # trains on the child's batch, starts the next one
        assert out[M.FRESH_STALENESS] == 1.0 and s.ahead.job is not None
        child = s.ahead.sampler.proc
        assert child.is_alive() and s.ahead.sampler.version == 2
    finally:
        s.close()  # waits for the batch in flight, then stops the child
    assert child.exitcode == 0 and _gone(child.pid)


def test_the_process_run_trains_as_the_thread_run(tmp_path):
    texts_t, w_t = _run(tmp_path / "thread", None, "thread")
    texts_p, w_p = _run(tmp_path / "process", None, "process")
    assert texts_t == texts_p
    assert all(torch.equal(w_t[k], w_p[k]) for k in w_t)


CHILD = """
import os, sys, torch
from tests.exgrpo_core.test_overlap_process import _open, _prompts, KW, Prefetch
from exgrpo_core.rollout.sampler_process import ProcessSampler
if __name__ == "__main__":
    from pathlib import Path
    s = _open(Path(sys.argv[1]), "run.resume=never")
    s.engine.eos_ids = []  # (the engine's copy goes to the child at its start, below) rows never end early
    proc = ProcessSampler(s.engine, Prefetch)
    proc.start(s.engine.model, None, 0, _prompts(s), [2, 2, 2], 1, **KW).wait()
    print(proc.proc.pid, flush=True)
    proc.start(s.engine.model, None, 0, _prompts(s, 12), [4] * 12, 1, temperature=1.0, max_new_tokens=1900)
    os.kill(os.getpid(), 9)  # the trainer is SIGKILLed with a batch in flight (a minute's work): no clean-up runs
"""


def test_the_child_dies_with_a_killed_trainer(tmp_path):
    script = tmp_path / "trainer.py"
    script.write_text(textwrap.dedent(CHILD))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:  # files: a surviving child
        code = subprocess.run([sys.executable, str(script), str(tmp_path)], stdout=out, stderr=err, cwd=root,
                              env={**os.environ, "PYTHONPATH": root}, timeout=300).returncode  # holds no pipe open
    assert code == -9, (tmp_path / "err").read_text()[-2000:]
    pid = int((tmp_path / "out").read_text().split()[0])
    for _ in range(50):  # the kernel's PR_SET_PDEATHSIG kills it at once; the lifeline's poll within 0.2 s
        if _gone(pid):
            break
        time.sleep(0.1)
    assert _gone(pid)


def test_the_process_sampler_on_another_engine_is_refused_in_one_line(tmp_path):
    with pytest.raises(Exception, match="overlap_sampler=process is for the transformers engine; with rollout.engine=remote"):
        _cfg(tmp_path, "rollout.overlap=1", "rollout.overlap_sampler=process", "rollout.engine=remote",
             "rollout.server_url=http://x:8000")
    assert _cfg(tmp_path, "rollout.overlap=1").rollout.overlap_sampler == "thread"
