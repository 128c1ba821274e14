"""Process-group helpers: pure sharding, and the collectives in a real 2-process gloo group."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from exgrpo_core.training import distributed as D
from spawn_helpers import run_two


@pytest.mark.parametrize("n,world", [(0, 2), (1, 2), (5, 2), (7, 3), (8, 4), (3, 5)])
def test_shards_partition_in_order(n, world):
    items = list(range(n))
    parts = [D.shard(items, r, world) for r in range(world)]
    assert sum(parts, []) == items
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_single_process_helpers_are_identity():
    assert D.topology() == D.Topology(0, 1) and D.topology().is_main
    assert D.broadcast({"a": 1}) == {"a": 1}
    assert D.gather_lists([1, 2]) == [1, 2]
    assert D.all_reduce_sums({"x": 2.0, "y": 1.0}, ["x"]) == {"x": 2.0, "y": 1.0}
    assert D.all_reduce_max(3.0) == 3.0


def _worker(rank: int, world: int, port: int, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        topo = D.topology()
        plan = D.broadcast({"uids": ["a", "b", "c"]} if topo.is_main else None)
        mine = D.shard(plan["uids"], topo.rank, topo.world)
        gathered = D.gather_lists([u.upper() for u in mine])
        lin = torch.nn.Linear(2, 1, bias=False)
        with torch.no_grad():
            lin.weight.fill_(1.0)
        if rank == 0:  # rank 1 has no micro-batch: its gradient counts as zeros
            lin(torch.tensor([[1.0, 2.0]])).sum().backward()
        D.all_reduce_grads(lin.parameters())
        sums = D.all_reduce_sums({"n": float(len(mine)), "keep": float(rank)}, ["n", "missing"])
        out.put((rank, topo.world, plan, mine, gathered, lin.weight.grad.tolist(), sums, D.all_reduce_max(float(rank))))
    finally:
        dist.destroy_process_group()


def test_collectives_in_two_processes():
    items, codes = run_two(_worker, 2, timeout=120)
    res = sorted(items)
    assert codes == [0, 0]
    (r0, w0, plan0, mine0, gath0, g0, s0, m0), (r1, _, plan1, mine1, gath1, g1, s1, m1) = res
    assert w0 == 2 and plan0 == plan1 == {"uids": ["a", "b", "c"]}
    assert mine0 == ["a", "b"] and mine1 == ["c"]
    assert gath0 == ["A", "B", "C"] and gath1 is None
    assert g0 == g1 == [[1.0, 2.0]]
    assert s0["n"] == s1["n"] == 3.0 and s0["missing"] == 0.0 and s0["keep"] == 0.0 and s1["keep"] == 1.0
    assert m0 == m1 == 1.0


def test_gradients_are_summed_in_a_few_buckets_not_one_collective_per_parameter():
    from exgrpo_core.models.build import build_tiny_model, build_tiny_tokenizer

    model = build_tiny_model(build_tiny_tokenizer(), hidden_size=64, num_layers=24, num_heads=4, intermediate_size=128)
    params = list(model.parameters())
    assert len(params) > 200  # a 24-layer model: one all-reduce per parameter was ~220 collectives a step
    buckets = D.grad_buckets(params, bucket_bytes=1 << 20)
    assert [p for b in buckets for p in b] == params  # every parameter once, in order
    need = -(-sum(p.numel() * 4 for p in params) // (1 << 20))  # full 1 MiB buckets the bytes need
    assert need <= len(buckets) <= need + 1 < 10 and all(sum(p.numel() * 4 for p in b) <= 1 << 20 for b in buckets)
    assert len(D.grad_buckets(params)) == 1  # 25 MiB buckets: the whole tiny model in one collective
    big = [torch.nn.Parameter(torch.zeros(300_000)), torch.nn.Parameter(torch.zeros(10))]
    assert [len(b) for b in D.grad_buckets(big, bucket_bytes=1 << 20)] == [1, 1]  # larger than a bucket: alone


def _send_tensors(rank: int, world: int, port: int, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        ids = torch.arange(1 << 16, dtype=torch.long).reshape(256, 256)
        sent = {"ids": ids, "mask": ids > 100, "adv": torch.linspace(-1, 1, 7, dtype=torch.bfloat16),
                "strided": ids[::3, 1::5], "empty": torch.zeros(0, 4), "scalar": torch.tensor(2.5, dtype=torch.float64),
                "rows": [("q1", [1, 2, 3], 0.5)], "none": None}
        got = D.broadcast(sent if rank == 0 else None)
        same = all(torch.equal(got[k], sent[k]) and got[k].dtype == sent[k].dtype and got[k].shape == sent[k].shape
                   for k in ("ids", "mask", "adv", "strided", "empty", "scalar"))
        out.put((rank, {"same": same and got["rows"] == sent["rows"] and got["none"] is None,
                        "bytes": dict(D.BROADCAST_BYTES), "tensor_bytes": sum(
                            sent[k].numel() * sent[k].element_size() for k in ("ids", "mask", "adv", "strided",
                                                                                "empty", "scalar"))}))
    finally:
        dist.destroy_process_group()


def test_a_batch_of_tensors_travels_as_raw_bytes_not_pickles():
    items, codes = run_two(_send_tensors, 2, timeout=120)
    got = dict(items)
    assert codes == [0, 0] and got[0]["same"] and got[1]["same"]
    for r in (0, 1):
        sent = got[r]["bytes"]
        assert sent["calls"] == 1 and sent["tensors"] == got[r]["tensor_bytes"]  # 0.6 MB of tensors
        assert sent["pickled"] < 2048, sent  # the pickled part holds only the small records and the layout
