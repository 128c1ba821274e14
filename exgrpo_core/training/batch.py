"""Turn rollouts and replayed trajectories into right-padded training tensors (`TrainBatch`).

Row layout: prompt tokens then response tokens then padding. Position t of `old_logprobs` holds the
behaviour log-prob of token t, matching `policy.token_logprobs_and_entropy`, which scores token t
from the tokens before it.
"""

from __future__ import annotations

import torch

from exgrpo_core.algorithm import importance
from exgrpo_core.types import Rollout, TrainBatch


def collate(rollouts: list[Rollout], advantages: list[float], pad_id: int,
            question_index: list[int] | None = None, tis_cap: float | None = None, is_level: str = "token",
            is_mode: str = "truncate") -> TrainBatch:
    """Pack N rollouts into `TrainBatch` tensors of width L = max(P + T).

    Args:
        rollouts: fresh rollouts and replayed trajectories (`replayed_from` set), N of them.
        advantages: [N] group-relative advantage of each row.
        pad_id: token used for padding (masked out everywhere).
        question_index: [N] batch position of each row's question (mini-batches split on it).
        tis_cap: when set, `tis_weights` = min(exp(behaviour - sampler log-prob), cap) on fresh
            rows that carry `sampler_logprobs` (truncated importance sampling), 1 elsewhere.
        is_level, is_mode: per token or per sequence, truncated or masked (`algorithm.importance.fresh_weights`).
    """
    if len(rollouts) != len(advantages):
        raise ValueError(f"{len(rollouts)} rollouts but {len(advantages)} advantages")
    width = max(len(r.prompt_ids) + len(r.response_ids) for r in rollouts)
    n = len(rollouts)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    response = torch.zeros((n, width), dtype=torch.bool)
    old = torch.zeros((n, width), dtype=torch.float32)
    for i, r in enumerate(rollouts):
        p, t = len(r.prompt_ids), len(r.response_ids)
        input_ids[i, :p + t] = torch.tensor(r.prompt_ids + r.response_ids, dtype=torch.long)
        attention[i, :p + t] = 1
        response[i, p:p + t] = True
        old[i, p:p + t] = torch.tensor(r.behaviour_logprobs, dtype=torch.float32)
    return TrainBatch(
        input_ids=input_ids, attention_mask=attention, response_mask=response,
        advantages=torch.tensor(advantages, dtype=torch.float32), old_logprobs=old,
        is_replay=torch.tensor([r.replayed_from is not None for r in rollouts], dtype=torch.bool),
        meta={"question_index": list(question_index) if question_index is not None else list(range(n))},
        tis_weights=None if tis_cap is None else tis_weights(rollouts, old, tis_cap, is_level, is_mode))


def tis_weights(rollouts: list[Rollout], old: torch.Tensor, cap: float, level: str = "token",
                mode: str = "truncate") -> torch.Tensor:
    """Truncated importance sampling (Yao et al. 2025, as in verl): min(pi_trainer / pi_sampler, cap)
    per response token of fresh rollouts scored by the trainer; 1 on replayed rows and everywhere else."""
    out = torch.ones_like(old)
    for i, r in enumerate(rollouts):
        if r.replayed_from is not None or r.sampler_logprobs is None:
            continue
        p, t = len(r.prompt_ids), len(r.response_ids)
        if len(r.sampler_logprobs) != t:
            raise ValueError(f"rollout {i} has {len(r.sampler_logprobs)} sampler log-probs for {t} response tokens")
        sampler = torch.tensor(r.sampler_logprobs, dtype=torch.float32)
        out[i, p:p + t] = importance.fresh_weights(old[i, p:p + t], sampler, cap, level, mode)
    return out


def select_rows(batch: TrainBatch, rows: list[int], width: int | None = None) -> TrainBatch:
    """A sub-batch (mini- or micro-batch) trimmed to its own longest row (or to `width` columns, when the
    caller knows it: nothing is then read back from the device)."""
    idx = torch.tensor(rows, dtype=torch.long)
    if width is None:
        width = int(batch.attention_mask[idx].sum(-1).max().item()) if rows else 0
    return TrainBatch(
        input_ids=batch.input_ids[idx, :width], attention_mask=batch.attention_mask[idx, :width],
        response_mask=batch.response_mask[idx, :width], advantages=batch.advantages[idx],
        old_logprobs=batch.old_logprobs[idx, :width], is_replay=batch.is_replay[idx],
        meta={"question_index": [batch.meta["question_index"][i] for i in rows]},
        tis_weights=None if batch.tis_weights is None else batch.tis_weights[idx, :width])


def minibatch_rows(question_index: list[int], n_minibatches: int) -> list[list[int]]:
    """Split rows into n mini-batches by question, keeping each question's group together."""
    questions = sorted(set(question_index))
    per = -(-len(questions) // max(n_minibatches, 1))
    out = []
    for i in range(0, len(questions), per):
        chosen = set(questions[i:i + per])
        out.append([r for r, q in enumerate(question_index) if q in chosen])
    return [rows for rows in out if rows]


def micro_batch_rows(batch: TrainBatch | None, size: int, max_tokens: int | None = None,
                     by_response: bool = False, spans: list[tuple] | None = None) -> list[list[int]]:
    """Rows in micro-batches of at most `size` rows and `max_tokens` padded tokens, shortest first.

    Exact: a mini-batch's loss is a sum over its micro-batches with a shared denominator, so the
    grouping only changes float rounding. Rows are ordered by length (by response length when
    `by_response`: rows whose prompts run apart pad only their responses), so each micro-batch pads
    little; a row longer than `max_tokens` goes alone. Example: lengths [9, 3, 8, 2], size 2
    -> [[3, 1], [2, 0]]; with max_tokens 10 -> [[3, 1], [2], [0]]. `spans`: the rows' `packing.row_spans`,
    known on the host (the batch is then not read).
    """
    if spans is None:
        lengths = batch.attention_mask.sum(-1)
        order = torch.argsort(batch.response_mask.sum(-1) if by_response else lengths, stable=True).tolist()
        lengths = lengths.tolist()
    else:
        lengths = [s[1] for s in spans]
        keys = [s[3] for s in spans] if by_response else lengths
        order = sorted(range(len(spans)), key=keys.__getitem__)  # stable, as argsort(stable=True)
    out: list[list[int]] = []
    widest = 0
    for i in order:
        last = out[-1] if out else None
        if last is None or len(last) >= size or (max_tokens is not None and
                                                 (len(last) + 1) * max(widest, lengths[i]) > max_tokens):
            out.append([i])
            widest = lengths[i]
        else:
            last.append(i)
            widest = max(widest, lengths[i])
    return out


def prompt_groups(prompts: list[tuple | None], size: int, max_tokens: int | None = None) -> list[list[int]]:
    """Rows in groups of at most `size` distinct prompts (and `max_tokens` padded prompt tokens), in
    first-seen order: each group's prompts run once for all its micro-batches (`optimise`). Rows with
    no prompt (None: nothing scored) join the first group. Example: prompts [a, b, a, c, None], size 2
    -> [[0, 1, 2, 4], [3]].
    """
    groups: list[list[int]] = []
    seen: list[dict[tuple, None]] = []
    where: dict[tuple, int] = {}
    for i, p in enumerate(prompts):
        if p is None:
            continue
        if p not in where:
            last = seen[-1] if seen else None
            longest = max([len(p), *(len(q) for q in last)]) if last else len(p)
            if last is None or len(last) >= size or (max_tokens is not None and (len(last) + 1) * longest > max_tokens):
                groups.append([])
                seen.append({})
            seen[-1][p] = None
            where[p] = len(groups) - 1
        groups[where[p]].append(i)
    loose = [i for i, p in enumerate(prompts) if p is None]
    if not groups:
        return [loose] if loose else []
    groups[0] = sorted(groups[0] + loose)
    return groups


def share_rows(batch: TrainBatch, rank: int, world: int) -> list[int]:
    """This process's rows of a mini-batch: every world-th row by length, so shares cost about the same."""
    order = torch.argsort(batch.attention_mask.sum(-1), stable=True).tolist()
    return sorted(order[rank::world])
