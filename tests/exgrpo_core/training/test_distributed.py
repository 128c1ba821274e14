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
