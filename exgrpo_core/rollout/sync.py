"""After every optimiser step: push the trainer's weights to an external rollout engine (vLLM) and
prove they landed — a known silent failure in peers is an engine that keeps sampling from stale weights.

Two checks per step: (1) checksums of the parameters vLLM keeps unfused and replicated (the RMSNorm
weights) must equal the trainer's, cast to the engine's dtype — a hard error otherwise; (2) the mean
absolute log-prob gap between engine and trainer on a fixed probe sequence, logged as a metric.
The transformers engine shares the trainer's module, so it needs neither.
"""

from __future__ import annotations

import time
from typing import Iterable

import torch

from exgrpo_core.training import fsdp
from exgrpo_core import metrics as M
from exgrpo_core.rollout.vllm_engine import probe_gap


class EngineSyncError(RuntimeError):
    """The rollout engine's weights differ from the trainer's after a push."""


def is_checked(name: str) -> bool:
    """A normalisation weight: kept unfused and replicated by vLLM's loaders, so its checksum compares."""
    return name.endswith("norm.weight")


def checksum(tensor: torch.Tensor, dtype: torch.dtype) -> float:
    """float64 sum of the tensor as the engine holds it (cast to the engine's dtype)."""
    return float(tensor.detach().to(dtype).double().sum())


def norm_names(model) -> list[str]:
    return [n for n, _ in model.named_parameters() if is_checked(n)]


def trainer_checksums(model, names: list[str], dtype: torch.dtype) -> dict[str, float]:
    params = dict(model.named_parameters())
    return {n: checksum(params[n], dtype) for n in names}


def compare_checksums(trainer: dict[str, float], engine: dict[str, float], rel: float = 1e-9) -> list[str]:
    """Names whose engine checksum is missing or differs from the trainer's."""
    return [n for n, v in trainer.items()
            if n not in engine or abs(engine[n] - v) > rel * max(1.0, abs(v))]


@torch.no_grad()
def trainer_probe(model, token_ids: list[int]) -> list[float]:
    """Trainer log-probs of tokens 1..n-1 of `token_ids` (temperature 1)."""
    dev = fsdp.compute_device(model)
    logits = model(input_ids=torch.tensor([token_ids], device=dev)).logits[0, :-1].float()
    logp = torch.log_softmax(logits, -1)
    return logp.gather(-1, torch.tensor(token_ids[1:], device=dev)[:, None])[:, 0].tolist()


def push_and_check(engine, model, probe_ids: list[int], engine_dtype: torch.dtype, *,
                   named: Iterable | None = None, trainer_logps: list[float] | None = None) -> dict[str, float]:
    """Push weights, verify checksums (raise on mismatch), and return the sync metrics.

    `named` (default: the model's named parameters) are the tensors pushed and checked; it may be a
    stream, e.g. whole tensors gathered one at a time from FSDP2 shards: the checksums are taken as
    the tensors go by. `trainer_logps` (default: computed from `model`) are the probe's.
    """
    t0 = time.perf_counter()
    mine: dict[str, float] = {}

    def tapped():
        for n, t in (model.named_parameters() if named is None else named):
            if is_checked(n):
                mine[n] = checksum(t, engine_dtype)
            yield n, t

    stream = tapped()
    engine.push_weights(stream)
    for _ in stream:  # an engine that stopped reading still gets checked (and FSDP2 gathers stay in step)
        pass
    bad = compare_checksums(mine, engine.checksums(list(mine)))
    if bad:
        raise EngineSyncError(f"rollout engine weights differ from the trainer's after a push "
                              f"({len(bad)} of {len(mine)} checked tensors, e.g. {bad[0]}); stopping "
                              "before sampling from stale weights")
    gap = probe_gap(engine.probe(probe_ids), trainer_logps if trainer_logps is not None
                    else trainer_probe(model, probe_ids))
    return {M.ENGINE_SYNC_GAP: gap, M.ENGINE_SYNC_S: time.perf_counter() - t0}
