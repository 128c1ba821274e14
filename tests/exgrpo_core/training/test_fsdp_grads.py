"""FSDP2 gradient accumulation holds only each process's shard: every micro-batch's backward reduce-scatters,
so no process keeps a whole float32 gradient between micro-batches (two gloo processes)."""

from __future__ import annotations

from functools import partial

import torch

from exgrpo_core.algorithm import losses
from exgrpo_core.config.schema import ExGRPOConfig
from exgrpo_core.models.build import build_tiny_model, build_tiny_tokenizer
from exgrpo_core.training import fsdp
from exgrpo_core.training.batch import collate
from exgrpo_core.training.optimise import optimise
from exgrpo_core.types import Rollout
from spawn_helpers import as_rank, run_two


def _accumulate(rank: int) -> dict:
    from exgrpo_core.run.session import adamw, make_accelerator

    acc = make_accelerator(ExGRPOConfig())
    tok = build_tiny_tokenizer()
    model = fsdp.shard_model(build_tiny_model(tok, hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128,
                                              seed=0), acc.device, bf16=False)
    rows = [Rollout(f"q{i}", [1, 7 + i, 9], [5 + i, 6, 7, 8], [-2.0] * 4, "", False, 0) for i in range(8)]
    batch = collate(rows, [1.0, -1.0] * 4, tok.pad_token_id, list(range(8)))
    held, shapes = [], {}
    backward = acc.backward

    def watched(loss):  # after each micro-batch's backward: what FSDP2 keeps until the next one
        backward(loss)
        held.append(fsdp.unsharded_grad_bytes(model))
        for n, p in model.named_parameters():
            if p.grad is not None:
                shapes[n] = (tuple(p.grad.to_local().shape), tuple(p.shape))

    acc.backward = watched
    optimise(model, adamw(model.parameters(), lr=0.0, weight_decay=0.0), acc, batch, n_minibatches=1, micro_batch_size=1,
             onpolicy_term=partial(losses.clipped_ratio_term, clip_eps=0.2),
             replay_term=partial(losses.shaped_replay_term, beta=0.1), aggregation="token_mean",
             max_response_len=4, entropy_coef=0.0, kl_coef=0.0, ref_model=None, max_grad_norm=1e9,
             skip_grad_norm=None, shard=(rank, 2), sharded=True)
    whole = sum(p.numel() * 4 for p in model.parameters())
    return {"held": held, "whole_bytes": whole, "shapes": shapes}


def _spawned(rank: int, port: int, out):
    as_rank(rank, port, out, _accumulate)


def test_no_whole_gradient_is_held_between_micro_batches():
    items, codes = run_two(_spawned)
    got = dict(items)
    assert not [r["error"] for r in got.values() if "error" in r] and codes == [0, 0]
    for r in got.values():
        assert len(r["held"]) >= 4  # four rows per process, one per micro-batch
        assert r["held"] == [0] * len(r["held"]), f"whole float32 gradients held: {r['held']} of {r['whole_bytes']}"
        big = {n: s for n, s in r["shapes"].items() if s[1][0] >= 2}
        assert big and all(local[0] in (full[0] // 2, -(-full[0] // 2)) for local, full in big.values())  # half the rows
    assert torch.distributed.is_available()
