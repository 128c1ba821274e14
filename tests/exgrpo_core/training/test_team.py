"""The team of training processes: two gloo processes give the one-process results, with the
weights replicated (DDP-style), sharded (FSDP2), and sharded with the shards in CPU memory (offload).

One optimiser call over two mini-batches (AdamW, uneven shares, token-budget micro-batches, a
replayed row) leaves the same weights and stats as in one process; scoring gives the same log-probs
and entropies; sampling returns every prompt's n responses in order and repeats under the same seed;
a follower refuses an unknown operation.
"""

from __future__ import annotations

import os
from functools import partial

import pytest
import torch

from exgrpo_core.algorithm import losses
from exgrpo_core.config.schema import ExGRPOConfig
from exgrpo_core.models.build import build_tiny_model, build_tiny_tokenizer
from exgrpo_core.rollout.engine import TransformersEngine
from exgrpo_core.run.session import adamw
from exgrpo_core.training import fsdp
from exgrpo_core.training.batch import collate, micro_batch_rows
from exgrpo_core.training.team import Team, TeamError, Worker, serve
from exgrpo_core.types import Rollout
from spawn_helpers import run_two

KW = dict(n_minibatches=2, micro_batch_size=3, micro_batch_tokens=24,
          onpolicy_term=partial(losses.clipped_ratio_term, clip_eps=0.2),
          replay_term=partial(losses.shaped_replay_term, beta=0.1), aggregation="token_mean", max_response_len=12,
          entropy_coef=0.001, kl_coef=0.0, temperature=1.0, max_grad_norm=1.0, skip_grad_norm=None)


def _rows() -> list[Rollout]:
    g = torch.Generator().manual_seed(3)
    rows = []
    for i in range(7):
        n = 12 if i == 2 else int(torch.randint(2, 8, (1,), generator=g))
        resp = torch.randint(5, 40, (n,), generator=g).tolist()
        rows.append(Rollout(f"q{i // 2}", [1, 7 + i, 9], resp, [-2.0 - 0.1 * t for t in range(n)], "", False, 0,
                            replayed_from=11 if i == 6 else None))
    return rows


def _worker(accelerator, mode: str = "replicate") -> Worker:
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, seed=0)
    sharded = mode != "replicate"
    if sharded:  # fsdp2 or fsdp2-offload
        model = fsdp.shard_model(model, accelerator.device, bf16=False, cpu_offload=mode == "fsdp2-offload")
    opt = adamw(model.parameters(), lr=0.01, weight_decay=0.01, eps=1e-4)  # eps: no rounding blow-up on tiny grads
    if not sharded:
        model, opt = accelerator.prepare(model, opt)
    engine = TransformersEngine(accelerator.unwrap_model(model), tok, batch_size=4)
    engine.synced = sharded
    return Worker(model, opt, accelerator, engine, None, scoring_micro_batch=2, temperature=1.0, sharded=sharded)


def _batch(worker: Worker):
    rows = _rows()
    return collate(rows, [1.0, -1.0, 0.5, -0.5, 0.0, 1.0, 0.7], worker.engine.pad_id, [0, 0, 1, 1, 2, 2, 2])


def _run(worker: Worker) -> dict:
    team = Team(worker)
    scored = team.score(_rows(), "mean")
    stats = team.optimise(_batch(worker), **KW)
    torch.manual_seed(5)
    gens_a = team.generate([[1, 7, 9], [1, 8, 9, 9], [1, 9]], 2, temperature=1.0, max_new_tokens=4)
    torch.manual_seed(5)
    gens_b = team.generate([[1, 7, 9], [1, 8, 9, 9], [1, 9]], 2, temperature=1.0, max_new_tokens=4)
    full = team.model_state()  # FSDP2: gathered from both processes
    state = full if full is not None else worker.accelerator.unwrap_model(worker.model).state_dict()
    params = {k: v.detach().tolist() for k, v in state.items()}
    return {"scored": scored, "stats": stats, "params": params,
            "gens": [[g.response_ids for g in group] for group in gens_a],
            "gens_again": [[g.response_ids for g in group] for group in gens_b]}


def _spawned(rank: int, mode: str, port: int, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", OMP_NUM_THREADS="1")
    from exgrpo_core.run.session import make_accelerator

    acc = make_accelerator(ExGRPOConfig())
    worker = _worker(acc, mode)
    if rank == 0:
        result = _run(worker)
        from exgrpo_core.training import distributed as D

        D.broadcast(("no-such-op", None))  # the follower must refuse it
        out.put((0, result))
    else:
        try:
            serve(worker)
            out.put((1, "served without error"))
        except TeamError as e:
            out.put((1, str(e)))


@pytest.fixture(scope="module", params=["replicate", "fsdp2", "fsdp2-offload"])
def two_process_result(request):
    items, _ = run_two(_spawned, request.param)
    return dict(items)


@pytest.fixture(scope="module")
def one_process_result():
    from accelerate import Accelerator

    return _run(_worker(Accelerator(cpu=True)))


def test_two_processes_train_like_one(one_process_result, two_process_result):
    one, two = one_process_result, two_process_result[0]
    for k, v in one["params"].items():
        torch.testing.assert_close(torch.tensor(two["params"][k]), torch.tensor(v), atol=2e-6, rtol=1e-5, msg=k)
    assert one["stats"]["loss/optimizer_steps"] == two["stats"]["loss/optimizer_steps"] == 2
    for key in ("loss/total", "loss/grad_norm", "loss/onpolicy_tokens", "loss/replay_tokens", "loss/iw_max",
                "loss/clipfrac", "loss/entropy"):
        assert two["stats"][key] == pytest.approx(one["stats"][key], rel=1e-5, abs=1e-7), key
    assert two["stats"].get("dist/param_gap", 0.0) == 0.0  # replicated weights are compared every step
    assert "dist/param_gap" not in one["stats"]


def test_two_processes_score_like_one(one_process_result, two_process_result):
    one, two = one_process_result, two_process_result[0]
    assert len(two["scored"]) == len(_rows())
    for (lp1, h1), (lp2, h2), r in zip(one["scored"], two["scored"], _rows()):
        assert len(lp2) == len(r.response_ids)
        assert lp2 == pytest.approx(lp1, abs=1e-5) and h2 == pytest.approx(h1, abs=1e-5)


def test_two_processes_sample_every_prompt_in_order(two_process_result):
    two = two_process_result[0]
    assert [len(g) for g in two["gens"]] == [2, 2, 2]
    assert all(1 <= len(ids) <= 4 for group in two["gens"] for ids in group)
    assert two["gens"] == two["gens_again"], "the same rank-0 seed must give the same samples"


def test_follower_refuses_unknown_operation(two_process_result):
    assert "unknown operation 'no-such-op'" in two_process_result[1]


def test_token_budget_micro_batches():
    tok = build_tiny_tokenizer()
    rows = [Rollout("q", [1], [5] * n, [0.0] * n, "", False, 0) for n in (8, 2, 7, 1)]  # lengths 9, 3, 8, 2
    batch = collate(rows, [0.0] * 4, tok.pad_token_id, [0, 0, 0, 0])
    assert micro_batch_rows(batch, 2) == [[3, 1], [2, 0]]
    assert micro_batch_rows(batch, 2, max_tokens=10) == [[3, 1], [2], [0]]
    assert micro_batch_rows(batch, 4, max_tokens=5) == [[3], [1], [2], [0]]  # a row over budget goes alone
    assert sorted(sum(micro_batch_rows(batch, 3, max_tokens=16), [])) == [0, 1, 2, 3]
    assert all(len(m) * max(batch.attention_mask[i].sum() for i in m) <= 16 or len(m) == 1
               for m in micro_batch_rows(batch, 3, max_tokens=16))
    # by response length: prompts of 6, 1, 1, 1 tokens, responses 1, 8, 4, 2 (lengths 7, 9, 5, 3)
    rows = [Rollout("q", p, [5] * n, [0.0] * n, "", False, 0) for p, n in (([1] * 6, 1), ([1], 8), ([1], 4), ([1], 2))]
    batch = collate(rows, [0.0] * 4, tok.pad_token_id, [0, 1, 2, 3])
    assert micro_batch_rows(batch, 2, by_response=True) == [[0, 3], [2, 1]]
    assert micro_batch_rows(batch, 2) == [[3, 2], [0, 1]]
    assert micro_batch_rows(batch, 2, max_tokens=12, by_response=True) == [[0], [3, 2], [1]]  # 2 x 7 > 12


class _PushEngine:
    """A rollout engine with its own weights (as vLLM): counts pushes; `drop` ignores them."""

    def __init__(self, model, drop: bool, shared: bool):
        import copy

        self.copy, self.drop, self.shared_by_processes, self.pushes = copy.deepcopy(model), drop, shared, 0

    def push_weights(self, named):
        self.pushes += 1
        if not self.drop:
            own = dict(self.copy.named_parameters())
            with torch.no_grad():
                for n, p in named:
                    own[n].copy_(p.detach())
        return 0

    def checksums(self, names):
        own = dict(self.copy.named_parameters())
        return {n: float(own[n].double().sum()) for n in names}

    def probe(self, ids):
        from exgrpo_core.rollout.sync import trainer_probe

        return trainer_probe(self.copy, ids)


def _spawned_push(rank: int, port: int, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", OMP_NUM_THREADS="1")
    from exgrpo_core.rollout.sync import EngineSyncError
    from exgrpo_core.run.session import make_accelerator

    worker = _worker(make_accelerator(ExGRPOConfig()))
    model = worker.accelerator.unwrap_model(worker.model)
    with torch.no_grad():
        model.model.norm.weight.add_(1.0)  # the engines start stale
    results = []
    for drop_on, shared in ((None, False), (None, True), (1, False)):  # all load / a shared engine / rank 1 drops
        worker.engine = _PushEngine(model, drop=rank == drop_on, shared=shared)
        with torch.no_grad():
            model.model.norm.weight.add_(0.5)
        try:
            if rank == 0:
                stats = Team(worker).push_weights([1, 5, 6, 7], torch.float32)
                D_ok = stats["engine/sync_logprob_gap"] < 1e-6
            else:
                serve_one = worker.push_weights  # what serve() runs for this operation
                from exgrpo_core.training import distributed as D

                op, args = D.broadcast(None)
                assert op == "push_weights"
                serve_one(args)
                D_ok = True
            results.append(("ok", D_ok, worker.engine.pushes))
        except EngineSyncError as e:
            results.append(("error", str(e)[:80], worker.engine.pushes))
    out.put((rank, results))


def test_every_process_pushes_to_its_engine_and_a_failed_check_stops_all():
    items, _ = run_two(_spawned_push)
    got = dict(items)
    own, shared, dropped = zip(got[0], got[1])
    assert own == (("ok", True, 1), ("ok", True, 1))  # each process pushed to its own engine
    assert shared == (("ok", True, 1), ("ok", True, 0))  # a shared engine (rollout server): rank 0 only
    assert dropped[0][0] == dropped[1][0] == "error"  # rank 1's engine kept stale weights: both stop
    assert "another training process" in dropped[0][1] and "differ from the trainer" in dropped[1][1]
