"""HSDP (`train.hsdp`): four gloo processes simulating two machines of two (LOCAL_WORLD_SIZE=2) shard
the model on a 2-D mesh (replicate x shard), train like one process over several micro-batches, and
write a sharded checkpoint (weights and AdamW state, each replicated shard written once) that reads
back into the same weights and optimiser state. The mesh-shape decision is tested without processes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from exgrpo_core.config.load import ConfigError, load_config
from exgrpo_core.models.build import build_tiny_model, build_tiny_tokenizer
from exgrpo_core.training import fsdp
from exgrpo_core.training.batch import collate
from exgrpo_core.training.optimise import optimise
from spawn_helpers import as_rank, run_procs
from test_team import KW, _rows

# one optimiser step; 7 rows over 4 processes: 2, 2, 2, 1 rows, so two micro-batches each (one padded)
STEP = {**KW, "n_minibatches": 1, "micro_batch_size": 1}


def _model():
    tok = build_tiny_tokenizer()
    return build_tiny_model(tok, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, seed=0), tok


def _train(model, opt, acc, tok, shard=(0, 1), sharded=False) -> dict:
    batch = collate(_rows(), [1.0, -1.0, 0.5, -0.5, 0.0, 1.0, 0.7], tok.pad_token_id, [0, 0, 1, 1, 2, 2, 2])
    return optimise(model, opt, acc, batch, ref_model=None, shard=shard, sharded=sharded, **STEP)


def _full_optimizer(model, opt) -> dict:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def _hsdp(rank: int, tmp: str) -> dict:
    import torch.distributed.checkpoint as dcp

    from exgrpo_core.config.schema import ExGRPOConfig
    from exgrpo_core.run.session import adamw, make_accelerator

    acc = make_accelerator(ExGRPOConfig())
    shape = fsdp.mesh_shape("auto", 4, fsdp.local_world_size(4))
    model, tok = _model()
    model = fsdp.shard_model(model, acc.device, bf16=False, shape=shape)
    weight = model.model.layers[0].mlp.up_proj.weight
    mesh = (weight.device_mesh.mesh.tolist(), weight.device_mesh.mesh_dim_names, weight.placements)
    opt = adamw(model.parameters(), lr=0.01, weight_decay=0.01, eps=1e-4)
    stats = _train(model, opt, acc, tok, shard=(rank, 4), sharded=True)
    full = fsdp.full_model_state(model)  # rank 0 only
    moments = _full_optimizer(model, opt)
    fsdp.save_model_shards(model, f"{tmp}/model")
    fsdp.save_optimizer_shards(model, opt, f"{tmp}/optimizer")

    again, _ = _model()  # resume as the session does: the whole weights read in each process, then sharded
    state = again.state_dict()
    dcp.load(state, checkpoint_id=f"{tmp}/model", no_dist=True)
    again.load_state_dict(state)
    again = fsdp.shard_model(again, acc.device, bf16=False, shape=shape)
    opt_again = adamw(again.parameters(), lr=0.01, weight_decay=0.01, eps=1e-4)
    fsdp.load_optimizer_shards(again, opt_again, f"{tmp}/optimizer")
    full_again, moments_again = fsdp.full_model_state(again), _full_optimizer(again, opt_again)
    if rank:
        return {"shape": shape, "mesh": mesh}
    resumed = all(torch.equal(full[k], full_again[k]) for k in full) and full.keys() == full_again.keys()
    same_moments = moments["state"].keys() == moments_again["state"].keys() and all(
        torch.equal(torch.as_tensor(v), torch.as_tensor(moments_again["state"][n][k]))
        for n, s in moments["state"].items() for k, v in s.items())
    return {"shape": shape, "mesh": mesh, "stats": stats, "params": {k: v.tolist() for k, v in full.items()},
            "resumed": resumed, "same_moments": same_moments, "n_moments": len(moments["state"])}


def _spawned(rank: int, tmp: str, port: int, out):
    as_rank(rank, port, out, _hsdp, tmp, world=4, local_world=2)


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hsdp")
    items, codes = run_procs(4, _spawned, str(tmp), timeout=400)
    got = dict(items)
    assert not [r["error"] for r in got.values() if "error" in r] and codes == [0, 0, 0, 0]
    return {**got[0], "tmp": tmp, "all": got}


def test_four_processes_on_two_simulated_machines_use_a_2d_mesh(four):
    from torch.distributed.tensor import Replicate, Shard

    for rank, r in four["all"].items():
        mesh, names, placements = r["mesh"]
        assert r["shape"] == (2, 2) and mesh == [[0, 1], [2, 3]] and names == ("replicate", "shard"), rank
        assert placements == (Replicate(), Shard(0)), rank  # replicated across machines, sharded within one


def test_hsdp_trains_like_one_process(four):
    from accelerate import Accelerator

    from exgrpo_core.run.session import adamw

    model, tok = _model()
    acc = Accelerator(cpu=True)
    model, opt = acc.prepare(model, adamw(model.parameters(), lr=0.01, weight_decay=0.01, eps=1e-4))
    stats = _train(model, opt, acc, tok)
    for k, v in acc.unwrap_model(model).state_dict().items():
        torch.testing.assert_close(torch.tensor(four["params"][k]), v, atol=2e-6, rtol=1e-5, msg=k)
    assert four["stats"]["loss/optimizer_steps"] == stats["loss/optimizer_steps"] == 1
    for key in ("loss/total", "loss/grad_norm", "loss/onpolicy_tokens", "loss/replay_tokens"):
        assert four["stats"][key] == pytest.approx(stats[key], rel=1e-5, abs=1e-7), key


def test_hsdp_checkpoint_writes_each_shard_once_and_resumes(four):
    from torch.distributed.checkpoint import FileSystemReader

    folder = Path(four["tmp"]) / "model"
    meta = FileSystemReader(str(folder)).read_metadata()
    assert {len(meta.state_dict_metadata[k].chunks) for k in four["params"]} == {2}  # one chunk per shard rank
    assert len(meta.storage_data) == 2 * len(four["params"])
    written = sum(f.stat().st_size for f in folder.glob("*.distcp"))
    assert written == sum(s.length for s in meta.storage_data.values())  # no replica wrote its copy again
    assert four["resumed"], "weights read back from the HSDP shards differ"
    assert four["n_moments"] > 0 and four["same_moments"], "AdamW state read back from the HSDP shards differs"


def test_mesh_shape_decision(monkeypatch):
    assert fsdp.mesh_shape("auto", 16, 8) == (2, 8)  # two machines of 8: replicate x shard
    assert fsdp.mesh_shape("auto", 8, 8) == (8,) and fsdp.mesh_shape("auto", 1, 1) == (1,)  # one machine
    assert fsdp.mesh_shape("off", 16, 8) == (16,)
    assert fsdp.mesh_shape("on", 4, 4) == (1, 4) and fsdp.mesh_shape("on", 8, 8, shard_size=2) == (4, 2)
    assert fsdp.mesh_shape("auto", 8, 8, shard_size=4) == (2, 4)
    with pytest.raises(ValueError, match="12 processes are not a multiple of the shard group of 8 .*LOCAL_WORLD_SIZE"):
        fsdp.mesh_shape("auto", 12, 8)
    with pytest.raises(ValueError, match="4 processes are not a multiple of the shard group of 3 .train.shard_size"):
        fsdp.mesh_shape("on", 4, 4, shard_size=3)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert fsdp.local_world_size(4) == 2
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert fsdp.local_world_size(4) == 4  # not launched by torchrun / accelerate: one machine


def test_hsdp_keys_are_checked():
    cfg = load_config("tiny", ["train.sharding=fsdp2"])
    assert cfg.train.hsdp == "auto" and cfg.train.shard_size is None
    with pytest.raises(ConfigError, match="train.hsdp=on and train.shard_size need train.sharding=fsdp2"):
        load_config("tiny", ["train.hsdp=on"])
    with pytest.raises(ConfigError, match="train.shard_size needs train.hsdp=auto or on"):
        load_config("tiny", ["train.sharding=fsdp2", "train.hsdp=off", "train.shard_size=4"])
    assert load_config("tiny", ["train.sharding=fsdp2", "train.hsdp=on", "train.shard_size=4"]).train.shard_size == 4
