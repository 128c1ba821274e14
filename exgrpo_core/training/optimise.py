"""One training step over a `TrainBatch`: mini-batches, micro-batch accumulation, clipping, skipping.

The loss terms are chosen once by the caller (docs/implementation_details.md) and passed in; this module only runs
forward / backward through Accelerate. The denominator is built per mini-batch so accumulation over
micro-batches is exact. (code) an optimiser step whose gradient norm exceeds `skip_grad_norm` is
skipped and counted.
With several processes (`shard=(rank, world)`) each takes a share of every mini-batch's rows; the
denominator is the whole mini-batch's, gradients are summed over processes before clipping, so the
step equals the one-process step up to float rounding, whatever the shares' sizes. Aggregation
`micro_sum_norm` is the authors' form instead: each micro-batch's loss has its own denominators
(`losses.micro_sum_norm_denominators`) and gradients are averaged over processes, as in their code.
With prompt sharing, a mini-batch's prompts (at most `micro_batch_size` distinct ones at a time, their
common prefix once) run once before its micro-batches, which attend to copies of their caches; the
prompts' backward runs once after them (`forward_parts.PromptKV`).
With `pack`, each micro-batch runs as one padding-free sequence (`packing`), planned on the host once
per mini-batch, so nothing is read back from the device inside a micro-batch; the loss statistics
stay tensors and are read back once, at the end (host syncs per optimiser step: a constant).
"""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict
from typing import Callable

import torch

from exgrpo_core.training import distributed as D, packing, policy
from exgrpo_core.algorithm import losses
from exgrpo_core.training.batch import micro_batch_rows, minibatch_rows, prompt_groups, select_rows, share_rows
from exgrpo_core.training.forward_parts import batch_prompts, can_share_prompts, prompt_kv
from exgrpo_core.types import TrainBatch


def optimise(model, optimizer, accelerator, batch: TrainBatch, *, n_minibatches: int,
             micro_batch_size: int, onpolicy_term: Callable, replay_term: Callable,
             aggregation: str, max_response_len: int, entropy_coef: float, kl_coef: float,
             ref_model, max_grad_norm: float, skip_grad_norm: float | None,
             temperature: float = 1.0, micro_batch_tokens: int | None = None,
             shard: tuple[int, int] = (0, 1), sharded: bool = False, share_prompts: bool = True,
             entropy_micro_tokens: int = 32768, pack: bool = False) -> dict[str, float]:
    """Run `n_minibatches` optimiser steps over the batch; return averaged detached stats."""
    rank, world = shard
    model.train()
    sums: dict[str, torch.Tensor] = {}  # read back once, after the last optimiser step
    maxes: dict[str, torch.Tensor] = {}
    steps = skipped = 0
    norms = 0.0
    for rows in minibatch_rows(batch.meta["question_index"], n_minibatches):
        mini = select_rows(batch, rows)
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"unknown loss aggregation {aggregation!r}; choose from {AGGREGATIONS}")
        denom = (losses.token_mean_denominator(mini.response_mask) if aggregation == "token_mean"
                 else losses.seq_sum_norm_denominator(len(rows), max_response_len))
        mean_denom = None
        optimizer.zero_grad(set_to_none=True)
        part = select_rows(mini, share_rows(mini, rank, world)) if world > 1 else mini
        spans = packing.row_spans(part)  # the rows' extents, read once for the whole mini-batch
        row_prompts = None  # (prompt sharing) each row's prompt, read once for the whole mini-batch
        if pack:
            micros = [(rows, None) for rows in packing.micro_batches([n for _, n, _, _ in spans], micro_batch_size,
                                                                     micro_batch_tokens)]
        else:
            row_prompts = (batch_prompts(part.input_ids, part.attention_mask, part.response_mask)
                           if share_prompts and not sharded and can_share_prompts(model) else None)
            micros = _micro_plan(model, part, micro_batch_size, micro_batch_tokens, share_prompts and not sharded,
                                 regroup=aggregation != "micro_sum_norm", spans=spans, prompts=row_prompts)
        if aggregation == "micro_sum_norm":  # (code) entropy / KL means over the authors' micro-batches, not ours
            micro_denom = losses.micro_sum_norm_denominators(part.response_mask[:0], max_response_len, world)[0]
            k = losses.virtual_micro_batches(int(part.attention_mask.sum()), entropy_micro_tokens)
            k = int(D.all_reduce_max(float(k))) if world > 1 else k  # (code) verl: the largest count of any rank
            mean_denom = losses.virtual_micro_denominator(int(part.response_mask.sum()), 0, entropy_micro_tokens,
                                                          world, micro_batches=k)
        if sharded:  # FSDP2: the same number of passes everywhere; padding passes train nothing
            micros += [(None, None)] * (int(D.all_reduce_max(float(len(micros)))) - len(micros))
        kv = None
        with _local_grads(model, 1 if sharded else world):
            for i, (micro_rows, group_prompts) in enumerate(micros):
                if group_prompts is not None:  # a group's first micro-batch: its prompts run once
                    kv = prompt_kv(model, group_prompts, part.input_ids.device)
                    kv = kv.detached() if kv is not None else None
                packed = host = None
                if micro_rows is None:
                    micro = select_rows(mini, [0])
                elif pack:
                    packed = packing.pack([spans[r] for r in micro_rows], part.input_ids.device)
                    micro = select_rows(part, micro_rows, width=packed.width)
                else:
                    micro = select_rows(part, micro_rows, width=max(spans[r][1] for r in micro_rows))
                    host = policy.HostRows([spans[r] for r in micro_rows],
                                           [row_prompts[r] for r in micro_rows] if row_prompts else None)
                if aggregation == "micro_sum_norm":  # (code) each micro-batch its own, averaged over ranks
                    denom = micro_denom
                loss, stats = _micro_loss(model, micro, denom, onpolicy_term, replay_term,
                                          entropy_coef, kl_coef, ref_model, micro_batch_size, temperature,
                                          share_prompts, mean_denom, kv, packed, host)
                if sharded:  # every pass reduce-scatters into the sharded gradient (no whole fp32 copy
                    loss = loss * world  # held between passes); FSDP2 averages over processes, we want the sum
                if sharded and hasattr(model, "set_requires_all_reduce"):  # HSDP: gradients cross machines
                    model.set_requires_all_reduce(i + 1 == len(micros))  # once per step (no-op on a 1-D mesh)
                with packing.packed_attention(model) if packed is not None else contextlib.nullcontext():
                    accelerator.backward(loss if micro_rows is not None else loss * 0.0)  # (recomputed layers too)
                if kv is not None and (i + 1 == len(micros) or micros[i + 1][1] is not None):
                    kv.backward()  # the group's prompt gradients, gathered over its micro-batches
                    kv = None
                if micro_rows is None:
                    continue
                for k, v in stats.items():  # 0-d tensors: added up on the device
                    if k == "loss/iw_max":
                        maxes[k] = torch.maximum(maxes[k], v) if k in maxes else v.clamp(min=0.0)
                    else:  # a mean over the micro-batch's tokens of its kind is weighted by that count
                        add = v if k.endswith("_tokens") or k in _ADDITIVE else v * stats[_WEIGHT_BY.get(k, "loss/onpolicy_tokens")]
                        sums[k] = sums[k] + add.double() if k in sums else add.double()
        if world > 1 and not sharded:
            D.all_reduce_grads(model.parameters())
        grad_norm = float(accelerator.clip_grad_norm_(model.parameters(), max_grad_norm))
        if skip_grad_norm is not None and (grad_norm > skip_grad_norm or not math.isfinite(grad_norm)):
            skipped += 1
            optimizer.zero_grad(set_to_none=True)
        else:
            optimizer.step()
        norms += grad_norm
        steps += 1
    optimizer.zero_grad(set_to_none=True)
    sums, maxes = _read_back(sums, maxes)
    if world > 1:  # every process's sums and maxes, the same on all of them
        sums = D.all_reduce_sums(sums, D.all_keys(list(sums)))
        maxes = {k: D.all_reduce_max(maxes.get(k, 0.0)) for k in D.all_keys(list(maxes))}
    sums["loss/grad_norm"] = norms
    out: dict[str, float] = {}
    for k, v in sums.items():
        if k == "loss/grad_norm" or k in _ADDITIVE:
            out[k] = v / max(steps, 1)  # mean over optimiser steps
        elif k.endswith("_tokens"):
            out[k] = v
        else:
            out[k] = v / max(sums[_WEIGHT_BY.get(k, "loss/onpolicy_tokens")], 1.0)  # token-weighted mean
    out.update(maxes)
    out["loss/skipped_steps"] = float(skipped)
    out["loss/optimizer_steps"] = float(steps)
    return out


def _read_back(sums: dict, maxes: dict) -> tuple[dict[str, float], dict[str, float]]:
    """The accumulated statistics as floats, in one host transfer."""
    names = list(sums) + list(maxes)
    values = torch.stack([t.double().reshape(()) for t in [*sums.values(), *maxes.values()]]).tolist() if names else []
    got = dict(zip(names, values))
    return defaultdict(float, {k: got[k] for k in sums}), {k: got[k] for k in maxes}


def _micro_plan(model, part: TrainBatch, size: int, max_tokens: int | None, share: bool, regroup: bool = True,
                spans: list[tuple] | None = None,
                prompts: list[tuple | None] | None = None) -> list[tuple[list[int] | None, list[tuple] | None]]:
    """Micro-batches as (rows, prompts): with prompt sharing, rows in groups of at most `size`
    distinct prompts (`batch.prompt_groups`: one group for cpu-demo's 8 questions), each cut into
    micro-batches in response-length order; the first micro-batch of a group carries the group's prompts, which
    then run once for all its micro-batches. Without sharing, or when the groups would change which
    rows go together and `regroup` is off (micro_sum_norm: each micro-batch has its own denominator),
    `micro_batch_rows` of the whole part. `spans` / `prompts`: the part's `packing.row_spans` and
    `batch_prompts`, when the caller has them (nothing is then read back here)."""
    spans = spans if spans is not None else packing.row_spans(part)
    if not (share and can_share_prompts(model)):
        return [(rows, None) for rows in micro_batch_rows(part, size, max_tokens, spans=spans)]
    if prompts is None:
        prompts = batch_prompts(part.input_ids, part.attention_mask, part.response_mask)
    groups = prompt_groups(prompts, size, max_tokens)
    if len(groups) > 1 and not regroup:
        return [(rows, None) for rows in micro_batch_rows(part, size, max_tokens, spans=spans)]
    plan = []
    for group in groups:
        sub = [spans[r] for r in group]
        for j, rows in enumerate(micro_batch_rows(None, size, max_tokens, by_response=True, spans=sub)):
            plan.append(([group[r] for r in rows], [prompts[r] for r in group if prompts[r]] if j == 0 else None))
    return plan


def _local_grads(model, world: int):
    """Accumulate this process's gradients without DDP's per-backward all-reduce (summed once per step)."""
    return model.no_sync() if world > 1 and hasattr(model, "no_sync") else contextlib.nullcontext()


AGGREGATIONS = ("seq_sum_norm", "token_mean", "micro_sum_norm")
"""Loss aggregation forms (config `loss.aggregation`)."""
# Means over replayed tokens; the rest (clipfrac) are means over on-policy tokens.
_WEIGHT_BY = {"loss/iw_mean": "loss/replay_tokens", "loss/iw_var": "loss/replay_tokens",
              "loss/shaped_iw_mean": "loss/replay_tokens"}
# Loss parts whose micro-batch values add up to the mini-batch value (shared denominator).
_ADDITIVE = ("loss/total", "loss/onpolicy", "loss/offpolicy", "loss/entropy", "loss/kl")


def _micro_loss(model, micro: TrainBatch, denom, onpolicy_term, replay_term, entropy_coef,
                kl_coef, ref_model, micro_batch_size, temperature, share_prompts=True, mean_denom=None,
                prompts=None, packed=None, host=None):
    """Forward one micro-batch and build the mixed-policy loss (ExGRPO Eq. 4, code weighting); stats as
    0-d tensors. `packed`: the micro-batch's `packing.Packed` indices (padding-free forward); `host`: its
    `policy.HostRows` (padded forward without host syncs)."""
    def score(m, with_entropy):
        if packed is not None:
            return packing.packed_logprobs_and_entropy(m, micro.input_ids, packed, with_entropy=with_entropy,
                                                       temperature=temperature)
        return policy.token_logprobs_and_entropy(
            m, micro.input_ids, micro.attention_mask, micro_batch_size=micro_batch_size, with_entropy=with_entropy,
            temperature=temperature, score_mask=micro.response_mask, share_prompts=share_prompts,
            prompts=prompts if m is model else None, host=host)

    logp, ent = score(model, entropy_coef > 0)
    ref_logp = None
    if kl_coef > 0 and ref_model is not None:
        with torch.no_grad():
            ref_logp, _ = score(ref_model, False)
    return losses.mixed_policy_loss(
        logp, micro.old_logprobs, micro.advantages, micro.response_mask, micro.is_replay,
        onpolicy_term=onpolicy_term, replay_term=replay_term, denominator=denom,
        entropy_tok=ent, entropy_coef=entropy_coef, ref_logp=ref_logp, kl_coef=kl_coef,
        onpolicy_weight=micro.tis_weights, mean_denominator=mean_denom, tensor_stats=True)
