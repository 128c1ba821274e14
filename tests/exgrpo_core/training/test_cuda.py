"""On a CUDA GPU (marked gpu; skips with a reason elsewhere): the bf16 policy forward against a float32
reference, the optimiser step under FSDP2 in bf16, whole iterations of a session, and (on two GPUs)
two FSDP2 processes on NCCL against one process.

Run on a GPU machine: python -m pytest tests/exgrpo_core/training/test_cuda.py -q
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from exgrpo_core.config.load import load_config
from exgrpo_core.training import fsdp, policy
from exgrpo_core.training.batch import collate
from spawn_helpers import run_two
from test_team import KW, _batch, _rows, _run, _worker

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
TWO_GPUS = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL refuses two ranks on one GPU "
                              "('Duplicate GPU detected', seen with NCCL 2.28 on one H100): needs two GPUs")


@pytest.fixture(autouse=True)
def fresh_accelerator_state():
    """Accelerate keeps one state per process; these tests build CPU and GPU accelerators in turn."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)
    yield
    AcceleratorState._reset_state(True)


def _model(seed: int = 0):
    from exgrpo_core.models.build import build_tiny_model, build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    return build_tiny_model(tok, hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, seed=seed), tok


def test_bf16_forward_on_cuda_matches_float32_reference():
    model, tok = _model()
    rows = _rows()
    batch = collate(rows, [0.0] * len(rows), tok.pad_token_id)
    with torch.no_grad():
        ref_lp, ref_h = policy.token_logprobs_and_entropy(model.double(), batch.input_ids, batch.attention_mask,
                                                          micro_batch_size=3, temperature=1.0)
        lp, h = policy.token_logprobs_and_entropy(model.to("cuda", torch.bfloat16), batch.input_ids,
                                                  batch.attention_mask, micro_batch_size=3, temperature=1.0)
    assert lp.device.type == "cuda" and lp.dtype == torch.float32  # the maths after the logits is fp32
    m = batch.response_mask
    for got, ref in ((lp, ref_lp), (h, ref_h)):
        got, ref = got.cpu().double()[m], ref[m]
        assert torch.isfinite(got).all()
        assert float((got - ref).norm() / ref.norm()) < 1e-2  # bf16 operands: 1e-3 .. 1e-2


def _one_gpu_accelerator(mixed: str):
    from accelerate import Accelerator

    return Accelerator(mixed_precision=mixed)


def test_fsdp2_bf16_step_on_cuda_keeps_fp32_master_weights_and_follows_float32():
    """One optimiser call (two mini-batches) with FSDP2 on one GPU in bf16: the weights stay float32
    (FSDP2 computes in bf16), the step moves them, and loss and weights follow a float32 CPU step."""
    from accelerate import Accelerator

    from accelerate.state import AcceleratorState

    ref = _run(_worker(Accelerator(cpu=True)))
    AcceleratorState._reset_state(True)
    acc = _one_gpu_accelerator("bf16")
    worker = _worker_fsdp2_bf16(acc)
    before = {n: p.detach().full_tensor().float().cpu().clone() for n, p in worker.model.named_parameters()}
    assert all(p.dtype == torch.float32 and p.device.type == "cuda" for p in worker.model.parameters())
    from exgrpo_core.training.team import Team

    stats = Team(worker).optimise(_batch(worker), **KW)
    assert stats["loss/optimizer_steps"] == 2 and math.isfinite(stats["loss/total"])
    assert stats["loss/total"] == pytest.approx(ref["stats"]["loss/total"], rel=5e-2, abs=1e-3)
    moved = 0
    for n, p in worker.model.named_parameters():
        now = p.detach().full_tensor().float().cpu()
        want = torch.tensor(ref["params"][n])
        moved += int(not torch.equal(now, before[n]))
        assert float((now - want).norm() / want.norm()) < 2e-2, n
    assert moved == len(before)


def _worker_fsdp2_bf16(acc):
    from exgrpo_core.models.build import build_tiny_model, build_tiny_tokenizer
    from exgrpo_core.rollout.engine import TransformersEngine
    from exgrpo_core.run.session import adamw
    from exgrpo_core.training.team import Worker

    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, seed=0)
    model = fsdp.shard_model(model, acc.device, bf16=True)
    opt = adamw(model.parameters(), lr=0.01, weight_decay=0.01, eps=1e-4)
    engine = TransformersEngine(model, tok, batch_size=4)
    engine.synced = True
    return Worker(model, opt, acc, engine, None, scoring_micro_batch=2, temperature=1.0, sharded=True)


@pytest.mark.parametrize("sharding", ["replicate", "fsdp2"])
def test_session_iterations_on_cuda_in_bf16(tmp_path, sharding):
    """The tiny preset in bf16 on the GPU, through the library loop: sampling, scoring, verification,
    buffer and optimiser steps run there, the weights stay float32 masters and change every step."""
    from exgrpo_core import loop
    from exgrpo_core.run.session import open_session

    cfg = load_config("tiny", [f"run.output_dir={tmp_path}", f"run.db_url=sqlite:///{tmp_path / 'x.db'}",
                               "run.resume=never", "model.dtype=bfloat16", f"train.sharding={sharding}",
                               "run.steps=3"])
    s = open_session(cfg)
    try:
        params = list(s.model.parameters())
        assert all(p.device.type == "cuda" and p.dtype == torch.float32 for p in params)
        for _ in range(3):
            first = params[1].detach().clone()
            stats = loop.run_iteration(s)
            assert stats["rollout/responses"] > 0 and math.isfinite(stats["loss/total"])
            assert stats["perf/train_tflops"] > 0
            assert not torch.equal(first, params[1].detach())
    finally:
        s.close()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def _spawned_nccl(rank: int, mode: str, port: int, out):
    """Rank `rank` of two, one GPU each, FSDP2 or replicated over NCCL."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", OMP_NUM_THREADS="1")
    try:
        from exgrpo_core.config.schema import ExGRPOConfig
        from exgrpo_core.run.session import make_accelerator
        from exgrpo_core.training import distributed as D
        from exgrpo_core.training.team import serve

        acc = make_accelerator(ExGRPOConfig())
        assert torch.distributed.get_backend() == "nccl", torch.distributed.get_backend()
        worker = _worker(acc, mode)
        if rank == 0:
            result = _run(worker)
            D.broadcast(("stop", None))
        else:
            serve(worker)
            result = "served"
    except BaseException:
        import traceback

        result = {"error": traceback.format_exc()}
    out.put((rank, result))


@TWO_GPUS
@pytest.mark.parametrize("mode", ["replicate", "fsdp2"])
def test_two_nccl_processes_train_like_one(mode):
    from accelerate import Accelerator

    one = _run(_worker(Accelerator(cpu=True)))
    items, codes = run_two(_spawned_nccl, mode, timeout=240, gpu=True)
    got = dict(items)
    assert "error" not in str(got[0])[:20] and got[1] == "served", (got, codes)
    two = got[0]
    for k, v in one["params"].items():
        torch.testing.assert_close(torch.tensor(two["params"][k]), torch.tensor(v), atol=1e-4, rtol=1e-3, msg=k)
    assert two["stats"]["loss/total"] == pytest.approx(one["stats"]["loss/total"], rel=1e-3, abs=1e-5)
    assert two["gens"] == two["gens_again"]
