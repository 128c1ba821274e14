"""Checkpoints with weight shards (run.checkpoint_weights=sharded, FSDP2): two gloo processes each
write their shard; one process reads the whole model back (`load_policy`, so `exgrpo evaluate` and
resume) and `exgrpo export` writes it as a plain Hugging Face folder. The end-to-end resume from such
a checkpoint is in tests/flows/test_multiprocess_e2e.py."""

from __future__ import annotations

import pytest
import torch

from exgrpo_core.config.load import ConfigError, load_config

from spawn_helpers import as_rank, run_two

TINY = dict(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64)


def _spawned(rank: int, tmp: str, port: int, out):
    as_rank(rank, port, out, _save, tmp)


def _save(rank: int, tmp: str) -> dict:
    import torch.distributed as dist

    from exgrpo_core.models.load import load_policy
    from exgrpo_core.run import checkpoint
    from exgrpo_core.training import distributed as D, fsdp

    dist.init_process_group("gloo")
    model, tok = load_policy("tiny", tiny=TINY, seed=0)
    model = fsdp.shard_model(model, torch.device("cpu"), bf16=False)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)  # not the initial weights
    full = {k: v.clone() for k, v in fsdp.full_model_state(model).items()}  # a collective
    if rank == 0:
        def shards(folder):
            D.broadcast(str(folder))
            fsdp.save_model_shards(model, str(folder))
        ckpt = checkpoint.save_checkpoint(tmp, 4, model, tok, None, {"run_id": "r"}, model_shards=shards,
                                          optimizer_shards=lambda folder: None)
    else:
        fsdp.save_model_shards(model, D.broadcast(None))
    D.shutdown()
    if rank:
        return {}
    torch.save(full, f"{tmp}/full.pt")  # tensors do not cross the queue once this process exits
    return {"ckpt": str(ckpt), "full": f"{tmp}/full.pt"}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    items, codes = run_two(_spawned, str(tmp_path_factory.mktemp("shards")))
    got = dict(items)
    assert not [r["error"] for r in got.values() if "error" in r] and codes == [0, 0]
    return {**got[0], "full": torch.load(got[0]["full"])}


def test_every_process_writes_its_shard_and_no_full_weights(saved):
    from pathlib import Path

    ckpt = Path(saved["ckpt"])
    assert len(list((ckpt / "model").glob("*.distcp"))) == 2
    assert not list(ckpt.glob("*.safetensors")) and (ckpt / "config.json").is_file()


def test_one_process_reads_the_whole_model_back(saved):
    from exgrpo_core.models.load import load_policy

    model, tok = load_policy(saved["ckpt"])
    state = model.state_dict()
    assert saved["full"].keys() <= state.keys()
    for name, value in saved["full"].items():
        assert torch.equal(state[name], value), name
    assert tok("1+2").input_ids


def test_export_writes_a_plain_folder(saved, tmp_path):
    from transformers import AutoModelForCausalLM

    from flows.cli import main

    assert main(["export", "--checkpoint", saved["ckpt"], "--out", str(tmp_path / "hf")]) == 0
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").state_dict()
    for name, value in saved["full"].items():
        assert torch.equal(plain[name], value), name
    assert main(["export", "--checkpoint", str(tmp_path / "nope"), "--out", str(tmp_path / "x")]) == 2
    before = (tmp_path / "hf" / "config.json").read_bytes()
    assert main(["export", "--checkpoint", saved["ckpt"], "--out", str(tmp_path / "hf")]) == 2  # never overwrites
    assert (tmp_path / "hf" / "config.json").read_bytes() == before


def test_a_damaged_shard_is_a_named_error(saved, tmp_path):
    import shutil

    from exgrpo_core.models.load import ModelLoadError, load_policy

    copy = tmp_path / "ckpt"
    shutil.copytree(saved["ckpt"], copy)
    victim = sorted((copy / "model").glob("*.distcp"))[0]
    victim.write_bytes(victim.read_bytes()[:20])
    with pytest.raises(ModelLoadError, match="weight shards of checkpoint"):
        load_policy(str(copy))


def test_sharded_weights_need_fsdp2():
    with pytest.raises(ConfigError, match="checkpoint_weights=sharded needs train.sharding=fsdp2"):
        load_config("tiny", ["run.checkpoint_weights=sharded"])
    assert load_config("tiny", ["run.checkpoint_weights=sharded", "train.sharding=fsdp2"])
