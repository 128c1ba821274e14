"""The device rule for collectives (training/distributed.py): NCCL serves CUDA tensors only, so a host
value sent through the default group fails there ("No backend type associated with device type cpu").

Two CPU processes join a default group whose backend map serves `cuda` alone ("cuda:gloo", as NCCL
serves); every helper that carries host values, and each caller that reduces host numbers (the
optimiser's statistics and micro-batch counts, the team's weight-gap check, the static decoder's
refresh vote), must run there through the gloo side group. A static check keeps every collective of
the package in distributed.py, each naming the group it runs on.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

from exgrpo_core.training import distributed as D
from spawn_helpers import run_two

ROOT = Path(__file__).resolve().parents[3]
COLLECTIVES = {"all_reduce", "broadcast", "broadcast_object_list", "gather_object", "all_gather_object",
               "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "gather", "scatter", "reduce",
               "barrier", "send", "recv", "scatter_object_list", "all_to_all"}


def _cuda_only(rank: int, port: int, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    dist.init_process_group("cuda:gloo", rank=rank, world_size=2)
    try:
        res = {"default_serves": dist.get_backend_config()}
        try:  # the failure NCCL gives a host tensor, reproduced
            dist.all_reduce(torch.ones(1, dtype=torch.float64))
            res["plain"] = "ok"
        except RuntimeError as e:
            res["plain"] = str(e)
        getattr(D, "host_group", lambda: None)()  # made first, as the session does right after joining
        res["sums"] = D.all_reduce_sums({"a": rank + 1.0, "b": 2.0}, ["a"])
        res["max"] = D.all_reduce_max(float(rank))
        res["keys"] = D.all_keys(["x"] if rank else ["y", "x"])
        res["gathered"] = D.gather_lists([rank])
        res["plan"] = D.broadcast({"uids": ["a", "b"]} if rank == 0 else None)
        batch = D.broadcast({"ids": torch.arange(6).reshape(2, 3)} if rank == 0 else None)  # raw bytes, host
        res["batch"] = batch["ids"].tolist()
        lin = torch.nn.Linear(2, 1, bias=False)
        lin.weight.grad = torch.full_like(lin.weight, float(rank + 1))
        D.all_reduce_grads(lin.parameters())
        res["grad"] = lin.weight.grad.tolist()

        from exgrpo_core.rollout.static_decode import _changed_anywhere
        from exgrpo_core.training.team import param_gap

        with torch.no_grad():
            lin.weight.fill_(1.0 + rank)
        res["gap"] = param_gap(lin)
        sharded = SimpleNamespace(parameters=lambda: [SimpleNamespace(full_tensor=None)])
        res["changed"] = _changed_anywhere(rank == 1, sharded)
        res["optimise"] = _optimise_two_ranks(rank)
        D.barrier()
        out.put((rank, res))
    except BaseException:
        import traceback

        out.put((rank, {"error": traceback.format_exc()}))
    finally:
        D.shutdown()


def _optimise_two_ranks(rank: int) -> dict:
    """`optimise` on a replicated tiny model with the authors' aggregation: its micro-batch count
    (largest over ranks) and statistics cross processes; gradients stay on the host here."""
    from functools import partial

    from accelerate import Accelerator

    from exgrpo_core.algorithm import losses
    from exgrpo_core.models.build import build_tiny_model, build_tiny_tokenizer
    from exgrpo_core.run.session import adamw
    from exgrpo_core.training.batch import collate
    from exgrpo_core.training.optimise import optimise
    from exgrpo_core.types import Rollout

    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, seed=0)
    rows = [Rollout(f"q{i}", [1, 7, 9], [5 + i] * (2 + 3 * i), [-1.0] * (2 + 3 * i), "", False, 0) for i in range(4)]
    batch = collate(rows, [1.0, -1.0, 0.5, -0.5], tok.pad_token_id, [0, 1, 2, 3])
    stats = optimise(model, adamw(model.parameters(), lr=0.01, weight_decay=0.0), Accelerator(cpu=True), batch, n_minibatches=1,
                     micro_batch_size=2, onpolicy_term=partial(losses.clipped_ratio_term, clip_eps=0.2),
                     replay_term=partial(losses.shaped_replay_term, beta=0.1), aggregation="micro_sum_norm",
                     max_response_len=12, entropy_coef=0.001, kl_coef=0.0, ref_model=None, max_grad_norm=1.0,
                     skip_grad_norm=None, shard=(rank, 2), entropy_micro_tokens=8)
    return {k: v for k, v in stats.items() if k in ("loss/total", "loss/grad_norm")}


def test_every_helper_runs_when_the_default_group_serves_no_host_tensor():
    items, codes = run_two(_cuda_only, timeout=240)
    got = dict(items)
    for r in (0, 1):
        assert "error" not in got[r], got[r]["error"]
    a, b = got[0], got[1]
    assert a["default_serves"] == "cuda:gloo"
    assert "No backend type associated with device type cpu" in a["plain"]  # what NCCL does to host values
    assert a["sums"] == b["sums"] == {"a": 3.0, "b": 2.0}
    assert a["max"] == b["max"] == 1.0
    assert a["keys"] == b["keys"] == ["x", "y"]
    assert a["gathered"] == [0, 1] and b["gathered"] is None
    assert b["plan"] == {"uids": ["a", "b"]} and b["batch"] == [[0, 1, 2], [3, 4, 5]]
    assert a["grad"] == b["grad"] == [[3.0, 3.0]]
    assert a["gap"] == b["gap"] > 0.3  # 2 vs 4: the weights differ and both processes see it
    assert a["changed"] is b["changed"] is True  # one process's change refreshes both
    assert a["optimise"] == b["optimise"] and a["optimise"]["loss/grad_norm"] > 0
    assert codes == [0, 0]


def _collective_calls(path: Path):
    """(function name, collective, keyword names) of each `dist.<collective>(...)` call in a file."""
    tree = ast.parse(path.read_text())
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "dist"
                    and node.func.attr in COLLECTIVES):
                yield fn.name, node.func.attr, {k.arg for k in node.keywords}


def test_every_collective_of_the_package_is_a_helper_that_names_its_group():
    outside = [(str(p.relative_to(ROOT)), name, call) for base in ("exgrpo_core", "flows")
               for p in (ROOT / base).rglob("*.py") if p.name != "distributed.py"
               for name, call, _ in _collective_calls(p)]
    assert not outside, f"collectives outside training/distributed.py (use its helpers): {outside}"
    helpers = list(_collective_calls(ROOT / "exgrpo_core" / "training" / "distributed.py"))
    assert len(helpers) >= 9
    unnamed = [(name, call) for name, call, kw in helpers if "group" not in kw]
    assert not unnamed, f"collectives on the default group by omission (host_group() or group_for()): {unnamed}"
