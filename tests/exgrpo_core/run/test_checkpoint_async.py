"""Async checkpoints (`run.async_checkpoint`, dcp.async_save): the shards are written in the background
and the checkpoint counts only once `finish_pending` waited for the writes and wrote its manifest. Two
gloo processes: weights changed right after the save do not leak into it; killed while an async
checkpoint is in flight, a run resumes from the checkpoint before it. A failed background write never
becomes a checkpoint."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from exgrpo_core.models.build import build_tiny_model, build_tiny_tokenizer
from exgrpo_core.rollout.remote import free_port
from exgrpo_core.run import checkpoint as C


def _sharded(acc):
    from exgrpo_core.run.session import adamw
    from exgrpo_core.training import fsdp

    tok = build_tiny_tokenizer()
    model = fsdp.shard_model(build_tiny_model(tok, hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128,
                                              seed=0), acc.device, bf16=False)
    return model, tok, adamw(model.parameters(), lr=0.01, weight_decay=0.0)


def _step(model, opt, value: float) -> None:
    for p in model.parameters():
        p.grad = torch.full_like(p, value)
    opt.step()


def _save(rank: int, run_dir: Path, step: int, model, tok, opt, background: bool) -> None:
    """What Session.save and the followers' serve loop do together: rank 0 writes the folder, every
    process its shards (in the same order)."""
    from exgrpo_core.training import fsdp

    tmp = C.checkpoint_dir(run_dir) / f".tmp_{C.folder_name(step)}"
    if rank == 0:
        C.save_checkpoint(run_dir, step, model, tok, opt, {"step": step}, keep=3,
                          model_shards=lambda f: fsdp.save_model_shards(model, str(f)),
                          optimizer_shards=lambda f: fsdp.save_optimizer_shards(model, opt, str(f)),
                          background=fsdp.wait_writes if background else None)
    else:
        fsdp.save_model_shards(model, str(tmp / C.MODEL_SHARDS))
        fsdp.save_optimizer_shards(model, opt, str(tmp / C.OPTIMIZER_SHARDS))


def _child(rank: int, port: int, tmp: str) -> None:
    from exgrpo_core.config.schema import ExGRPOConfig
    from exgrpo_core.run.session import make_accelerator
    from exgrpo_core.training import fsdp

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", OMP_NUM_THREADS="1")
    run_dir = Path(tmp) / "run"
    acc = make_accelerator(ExGRPOConfig())
    model, tok, opt = _sharded(acc)
    _step(model, opt, 0.01)
    fsdp.background_writes(True)
    saved = fsdp.full_model_state(model)  # rank 0: the weights the checkpoint must hold
    _save(rank, run_dir, 0, model, tok, opt, background=True)
    pending_visible = C.resume_point(run_dir) is not None if rank == 0 else None  # not yet a checkpoint
    _step(model, opt, 0.5)  # training goes on while the shards are written
    done = C.finish_pending(run_dir) if rank == 0 else None
    torch.distributed.barrier()
    again, _, opt_again = _sharded(acc)  # read it back as a resume does
    fsdp.load_model_shards(again, str(C.checkpoint_dir(run_dir) / C.folder_name(0) / C.MODEL_SHARDS))
    fsdp.load_optimizer_shards(again, opt_again, str(C.checkpoint_dir(run_dir) / C.folder_name(0) / C.OPTIMIZER_SHARDS))
    loaded = fsdp.full_model_state(again)
    if rank == 0:
        report = {"pending_visible": pending_visible, "done": str(done),
                  "intact": C.verify_checkpoint(done) is None,
                  "same": saved.keys() == loaded.keys() and all(torch.equal(saved[k], loaded[k]) for k in saved),
                  "moved_on": not all(torch.equal(saved[k], fsdp.full_model_state(model)[k]) for k in saved)}
    else:
        fsdp.full_model_state(model)
        report = {}
    (Path(tmp) / f"rank{rank}.json").write_text(json.dumps(report))
    torch.distributed.barrier()
    _save(rank, run_dir, 1, model, tok, opt, background=True)  # in flight when the kill comes
    os.kill(os.getpid(), signal.SIGKILL)


def test_async_checkpoint_counts_only_once_written_and_a_killed_one_is_never_resumed(tmp_path):
    ctx = mp.get_context("spawn")
    port = free_port()
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        procs = [ctx.Process(target=_child, args=(r, port, str(tmp_path))) for r in range(2)]
        for p in procs:
            p.start()
    finally:
        os.environ.pop("CUDA_VISIBLE_DEVICES") if hidden is None else os.environ.update(CUDA_VISIBLE_DEVICES=hidden)
    for p in procs:
        p.join(timeout=240)
        if p.is_alive():
            p.kill()
    assert [p.exitcode for p in procs] == [-signal.SIGKILL] * 2
    report = json.loads((tmp_path / "rank0.json").read_text())
    assert report["pending_visible"] is False  # written in the background: not yet resumable
    assert report["done"].endswith(C.folder_name(0)) and report["intact"]
    assert report["same"] and report["moved_on"]  # the step after the save did not leak into it
    run_dir = tmp_path / "run"
    assert C.resume_point(run_dir) == C.checkpoint_dir(run_dir) / C.folder_name(0)  # never the killed one
    assert not (C.checkpoint_dir(run_dir) / C.folder_name(1)).exists()


def test_a_failed_background_write_never_counts(tmp_path):
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, seed=0)
    opt = torch.optim.AdamW(model.parameters())

    def failed():
        raise RuntimeError("disk full")

    final = C.save_checkpoint(tmp_path, 0, model, tok, opt, {}, background=failed)
    assert final == C.checkpoint_dir(tmp_path) / C.folder_name(0) and not final.exists()
    assert C.resume_point(tmp_path) is None  # pending: not a checkpoint yet
    with pytest.warns(UserWarning, match="disk full.*does not count"):
        assert C.close_pending(tmp_path) is None
    assert C.resume_point(tmp_path) is None and not final.exists()
    assert C.finish_pending(tmp_path) is None  # nothing left pending


def test_async_checkpoint_needs_fsdp2():
    from exgrpo_core.config.load import ConfigError, load_config

    with pytest.raises(ConfigError, match="run.async_checkpoint needs train.sharding=fsdp2"):
        load_config("tiny", ["run.async_checkpoint=true"])
    assert load_config("tiny", ["run.async_checkpoint=true", "train.sharding=fsdp2"]).run.async_checkpoint
