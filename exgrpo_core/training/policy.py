"""Trainer-side forward: per-token log-probs and full-distribution entropies, and H(o) (docs/implementation_details.md).

Position t holds log p(x_t | x_<t) and the entropy of the distribution that predicted x_t; a row's
first real token gets 0. Right and left padding are both handled (position ids from the attention
mask). H(o) averages over the response's own tokens only; the authors' code appears to include
padding in that mean, which biases it toward short trajectories. No optimiser, no loss here.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from exgrpo_core.training import fsdp
from exgrpo_core.training.forward_parts import (UNMASKED, PromptKV, attention_as, batch_prompts, can_share_prompts,
                                                head_at, prompt_kv, shared_prompt_logits, takes_logits_to_keep)


class PolicyInputError(ValueError):
    """Inputs the forward pass cannot score (shape mismatch, holes in the attention mask, ...)."""


@dataclass
class HostRows:
    """What the host knows of a batch's rows before their forward, so that none is read back from the
    device there: each row's `packing.row_spans` (first real column, real tokens, first scored column,
    scored tokens: the score mask's span) and, with prompt sharing, its prompt (`forward_parts.batch_prompts`).
    `optimise` reads them once per mini-batch."""

    spans: list[tuple[int, int, int, int]]
    prompts: list[tuple | None] | None = None


def _host_plan(spans: list[tuple[int, int, int, int]]):
    """`_micro_forward`'s indices from the rows' spans, on the host: (lo, hi) the real columns, `first`
    the first logit column needed (in [lo, hi) coordinates), (rows, pos) the scored positions in
    row-major order (as `torch.nonzero`), and per row with a scored position its first and one-past-last
    predicting column. None when fewer than two columns are real."""
    real = [(f, n) for f, n, _, _ in spans if n]
    lo = min((f for f, _ in real), default=0)
    hi = max((f + n for f, n in real), default=0)
    if hi - lo < 2:
        return None
    ranges = [(max(f + 1, rs), min(f + n, rs + rn)) if n and rn else (0, 0) for f, n, rs, rn in spans]
    ranges = [(a - lo - 1, b - lo - 1) if a < b else None for a, b in ranges]  # predicting columns [a, b)
    first = min((a for a, _ in filter(None, ranges)), default=hi - lo - 2)
    rows, pos, used = [], [], []
    for i, r in enumerate(ranges):
        if r is not None:
            rows.extend([i] * (r[1] - r[0]))
            pos.extend(range(r[0] - first, r[1] - first))
            used.append((i, r[0], r[1]))
    return lo, hi, first, rows, pos, used


def _host_mask(model, am: torch.Tensor, spans, lo: int, hi: int):
    """(attention mask, attention name) to pass for `am` [n, l] when the rows' spans are known. For
    transformers' SDPA attention on full-attention layers: no mask when no row is padded, else the 4-D
    boolean mask it would build (causal, real keys), under a name that builds no mask (`forward_parts.UNMASKED`),
    so the model reads nothing back to decide (`masking_utils._ignore_causal_mask_sdpa`,
    `find_packed_sequence_indices`); the same mask and kernel as from `am`. Otherwise (`am`, None)."""
    config = getattr(getattr(model, "module", model), "config", None)
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return am, None
    if any(t != "full_attention" for t in getattr(config, "layer_types", None) or ()) or (
            getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True)):
        return am, None
    if all(f == lo and f + n == hi for f, n, _, _ in spans):
        return None, UNMASKED
    causal = torch.ones(hi - lo, hi - lo, dtype=torch.bool, device=am.device).tril()  # [l, l]: key <= query
    return causal[None, None] & (am != 0)[:, None, None, :], UNMASKED  # [n, 1, l, l]


def _check_inputs(input_ids, attention_mask, micro_batch_size, temperature, chunk_positions,
                  contiguous_known: bool = False) -> None:
    if input_ids.dim() != 2 or tuple(attention_mask.shape) != tuple(input_ids.shape):
        raise PolicyInputError(f"input_ids and attention_mask must both be [N, L], got "
                               f"{tuple(input_ids.shape)} and {tuple(attention_mask.shape)}")
    if micro_batch_size < 1 or chunk_positions < 1:
        raise PolicyInputError(f"micro_batch_size and chunk_positions must be >= 1, got "
                               f"{micro_batch_size} and {chunk_positions}")
    if not temperature > 0:
        raise PolicyInputError(f"temperature must be > 0, got {temperature}")
    if contiguous_known:  # the caller's `packing.row_spans` checked the rows
        return
    m = (attention_mask != 0).int()
    starts = (m[:, :1] + (m[:, 1:] - m[:, :-1]).clamp(min=0).sum(-1, keepdim=True)).squeeze(-1)  # [N]
    if (starts > 1).any():
        row = int(torch.nonzero(starts > 1)[0, 0])
        raise PolicyInputError(f"attention_mask row {row} has holes; only left or right padding "
                               "(one contiguous run of real tokens) is supported")


def split_blocks(flat: torch.Tensor, rows: int) -> tuple[torch.Tensor, ...]:
    """[M, V] -> blocks of `rows` positions whose backward writes one [M, V] gradient (split's: a
    concatenation). Slicing each block instead gives each a zero-filled [M, V] gradient that autograd
    then adds up: on an H200 (Qwen2.5-0.5B shape, 15k positions x 151,936) 15 fills and 14 adds of 9 GB,
    121 of an optimiser call's 400 GPU-busy ms."""
    return flat.split(rows)


def _block_scores(logits: torch.Tensor, targets: torch.Tensor, temperature: float,
                  with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(target) and H for one contiguous block of positions: logits [c, V], targets [c]."""
    if with_entropy:
        return _LogpEntropy.apply(logits, targets, temperature)
    x = logits.float()  # [c, V]; the only float copy of this block
    if temperature != 1.0:
        x = x / temperature
    log_z = torch.logsumexp(x, dim=-1)  # [c]
    return x.gather(-1, targets[:, None]).squeeze(-1) - log_z, None  # [c]


class _LogpEntropy(torch.autograd.Function):
    """log p(target) and H = -sum p log p of p = softmax(logits / T), with a hand-written backward:
    a few passes over the [c, V] block instead of autograd's chain through logsumexp, softmax and
    their products. d logp_t / dx = onehot_t - p and dH / dx = -p (log p + H), both / T."""

    @staticmethod
    def forward(ctx, logits, targets, temperature):
        y = logits.float().mul(1.0 / temperature)  # [c, V], a new tensor whatever the dtype
        shift = y.amax(-1, keepdim=True)
        y.sub_(shift)  # y = x - max
        p = torch.exp(y)
        z = p.sum(-1, keepdim=True)
        p.div_(z)  # softmax
        log_z = z.log()  # [c, 1]: log Z of y
        logp = y.gather(-1, targets[:, None]) - log_z  # [c, 1]
        h = log_z - (p * y).sum(-1, keepdim=True)  # log Z - sum p y (not a BLAS dot: its split varies by run)
        ctx.save_for_backward(y, p, log_z, h, targets)
        ctx.temperature, ctx.dtype = temperature, logits.dtype
        return logp.view(-1), h.view(-1)

    @staticmethod
    def backward(ctx, g_logp, g_h):
        y, p, log_z, h, targets = ctx.saved_tensors
        g_logp = torch.zeros_like(h) if g_logp is None else g_logp.float()[:, None]
        g_h = torch.zeros_like(h) if g_h is None else g_h.float()[:, None]
        # -p (g_logp + g_h (log p + H)), log p = y - log Z; then + g_logp at the target
        grad = y.sub(log_z - h).mul_(g_h).add_(g_logp).mul_(p).neg_()
        grad.scatter_add_(-1, targets[:, None], g_logp)
        return grad.mul_(1.0 / ctx.temperature).to(ctx.dtype), None, None


def _micro_forward(model, ids: torch.Tensor, am: torch.Tensor, with_entropy: bool, temperature: float,
                   chunk_positions: int, want: torch.Tensor | None,
                   share_prompts: bool = True, prompts: PromptKV | None = None,
                   host: HostRows | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Score one micro-batch [n, L]; columns that are padding in every row are skipped.

    Only positions that are scored (real, not a row's first token, and in `want` when given) reach the
    vocabulary: the output head runs on those positions' hidden states only (`forward_parts.head_at`;
    otherwise logits start at the first such column through `logits_to_keep`, when the model takes it)
    and the softmax runs over those positions only, `chunk_positions` at a time across all rows. Rows
    that share a prompt run it once (`forward_parts.shared_prompt_logits`, on `prompts` when given)
    when `share_prompts`. `host`: the rows' spans (and prompts) known on the host, which then give every
    index without a host sync (the same indices: the same values).
    """
    n, width = ids.shape
    plan = _host_plan(host.spans) if host is not None else None
    if host is None:
        cols = torch.nonzero(am.any(dim=0)).flatten()
    if (plan is None) if host is not None else cols.numel() < 2:  # nothing is predicted from a single column
        zeros = torch.zeros(n, width, device=ids.device)
        return zeros, (zeros.clone() if with_entropy else None)
    shared = None
    if host is not None:
        lo, hi, first, rows, pos, used = plan
        ids, am = ids[:, lo:hi], am[:, lo:hi]  # [n, l]
        rows, pos = (torch.tensor(x, dtype=torch.long).to(ids.device, non_blocking=True) for x in (rows, pos))
        if host.prompts is not None and used:
            shared = ([i for i, _, _ in used], [a for _, a, _ in used], [b for _, _, b in used],
                      [host.prompts[i] for i, _, _ in used])
    else:
        lo, hi = int(cols[0]), int(cols[-1]) + 1
        ids, am = ids[:, lo:hi], am[:, lo:hi]  # [n, l]
        valid = (am[:, 1:] != 0) & (am[:, :-1] != 0)  # [n, l-1]; a row's first real token is not predicted
        if want is not None:
            valid = valid & (want[:, lo + 1:hi] != 0)
        targets_at = torch.nonzero(valid.any(dim=0)).flatten()
        first = int(targets_at[0]) if targets_at.numel() else hi - lo - 2  # first logit column needed
        rows, pos = torch.nonzero(valid[:, first:], as_tuple=True)  # [M] each: the scored positions
    targets = ids[rows, first + pos + 1]  # [M]
    flat = (shared_prompt_logits(model, ids, am, rows, first + pos, prompts, shared)
            if share_prompts and rows.numel() and can_share_prompts(model) else None)  # [M, V] or None
    if flat is None:
        position_ids = (am.long().cumsum(-1) - 1).clamp(min=0)  # [n, l]; real tokens count from 0
        with head_at(model, rows, first + pos, (n, hi - lo)) as tap:
            keep = not tap.armed and takes_logits_to_keep(model)  # the hook wants the full [n, l, H] states
            kwargs = {"logits_to_keep": hi - lo - first} if keep else {}
            mask, name = _host_mask(model, am, host.spans, lo, hi) if host is not None else (am, None)
            with attention_as(model, name) if name else contextlib.nullcontext():
                logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids, use_cache=False,
                               **kwargs).logits  # [1, M, V] through the head hook, else [n, l - first, V] (or [n, l, V])
        if tap.hit:
            flat = logits[0]
        else:
            logits = logits[:, logits.shape[1] - (hi - lo - first):]  # column j predicts ids[:, first + j + 1]

    if flat is not None:  # [M, V], entry i scores (rows[i], pos[i]); blocks as in `split_blocks`
        blocks = split_blocks(flat, chunk_positions)
    else:  # [c, V]: the logits of scored positions s .. s + c
        blocks = [logits[rows[s:s + chunk_positions], pos[s:s + chunk_positions]]
                  for s in range(0, rows.numel(), chunk_positions)]
    shape = (n, hi - lo - 1 - first)  # [n, l-1-first]: the scored columns onward
    pieces = [_block_scores(b, t, temperature, with_entropy)
              for b, t in zip(blocks, targets.split(chunk_positions))]
    pad = (lo + 1 + first, width - hi)

    def place(values: list[torch.Tensor]) -> torch.Tensor:
        x = torch.zeros(shape, dtype=torch.float32, device=ids.device)  # [n, l-1-first]
        if values:
            x = x.index_put((rows, pos), torch.cat(values))
        else:  # nothing scored: zeros that still reach the graph, so backward() works
            x = x + (flat if flat is not None else logits).sum().float() * 0.0
        return F.pad(x, pad)  # [n, L]

    return place([p[0] for p in pieces]), (place([p[1] for p in pieces]) if with_entropy else None)


def token_logprobs_and_entropy(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                               micro_batch_size: int, with_entropy: bool = True, temperature: float = 1.0,
                               chunk_positions: int = 1024, score_mask: torch.Tensor | None = None,
                               share_prompts: bool = True, prompts: PromptKV | None = None,
                               host: HostRows | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log pi(x_t | x_<t) and entropy H_t = -sum_v pi(v | x_<t) log pi(v | x_<t) (docs/implementation_details.md).

    Runs under the caller's grad mode (with grad for the loss, `torch.no_grad()` for selection).
    Memory: one micro-batch of rows at a time; apart from the model's logits [n, l, V] (from the
    first scored column on), float temporaries are at most [chunk_positions, V] (logsumexp trick:
    H = log Z - sum softmax * logits).

    Args:
        model: causal LM returning `.logits` [n, l, V], called with input_ids, attention_mask, position_ids.
        input_ids: [N, L] token ids, right- or left-padded.
        attention_mask: [N, L], 1 on real tokens (one contiguous run per row).
        micro_batch_size: rows per forward pass.
        with_entropy: also return entropies (skip to save the softmax).
        temperature: logits are divided by it (behaviour log-probs use 1.0).
        chunk_positions: positions scored per softmax block (across the micro-batch's rows).
        score_mask: [N, L], optional: only these positions are scored (e.g. the response mask), the
            others are returned as 0 and their vocabulary softmax is never computed.
        share_prompts: rows of a micro-batch whose tokens before their first scored position agree
            run those tokens once (`forward_parts.shared_prompt_logits`); same values up to rounding.
            Without grad, the prompts of all micro-batches run once (`forward_parts.prompt_kv`) when
            there are at most `micro_batch_size` distinct ones.
        prompts: the caches of the rows' prompts, computed by the caller (`optimise` runs a
            mini-batch's prompts once for all its micro-batches); rows whose prompt it lacks share locally.
        host: `HostRows` of the rows (spans of the attention mask and of `score_mask`), read once by the
            caller: no host sync here. Used when the rows fit one micro-batch.

    Returns:
        logp [N, L] float32 and entropy [N, L] float32 (or None); 0 at padding, at each row's
        first real token and outside `score_mask`.
    """
    n = input_ids.shape[0]
    host = host if host is not None and n <= micro_batch_size and len(host.spans) == n else None
    _check_inputs(input_ids, attention_mask, micro_batch_size, temperature, chunk_positions, host is not None)
    if score_mask is not None and tuple(score_mask.shape) != tuple(input_ids.shape):
        raise PolicyInputError(f"score_mask must be [N, L] = {tuple(input_ids.shape)}, got {tuple(score_mask.shape)}")
    device = fsdp.compute_device(model)
    if n == 0:
        empty = torch.zeros(0, input_ids.shape[1], device=device)
        return empty, (empty.clone() if with_entropy else None)
    # rows of similar length share a forward, so less padding is computed; outputs keep the input order
    # (on the CPU: the row indices then select from inputs on any device, e.g. a CPU score_mask beside GPU ids)
    order = torch.argsort(attention_mask.sum(-1).cpu(), stable=True) if n > micro_batch_size else torch.arange(n)
    if (prompts is None and share_prompts and score_mask is not None and n > micro_batch_size
            and not torch.is_grad_enabled() and can_share_prompts(model)):  # scoring: each prompt once
        found = [p for p in batch_prompts(input_ids, attention_mask, score_mask.to(input_ids.device)) if p]
        if len(set(found)) <= micro_batch_size:  # at most one micro-batch of prompt rows in memory
            prompts = prompt_kv(model, found, device)
    logps, ents = [], []
    for start in range(0, n, micro_batch_size):
        rows = order[start:start + micro_batch_size]
        want = score_mask[rows].to(device) if score_mask is not None else None
        lp, h = _micro_forward(model, input_ids[rows].to(device), attention_mask[rows].to(device),
                               with_entropy, temperature, chunk_positions, want, share_prompts, prompts, host)
        logps.append(lp)
        ents.append(h)
    back = torch.argsort(order).to(device)  # [N]: position of each input row in the sorted output

    def restore(parts: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(parts).index_select(0, back) if n > micro_batch_size else torch.cat(parts)

    return restore(logps), (restore(ents) if with_entropy else None)


def _response_mean(values: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    if tuple(values.shape) != tuple(response_mask.shape) or values.dim() != 2:
        raise PolicyInputError(f"token values and response_mask must both be [N, L], got "
                               f"{tuple(values.shape)} and {tuple(response_mask.shape)}")
    keep = response_mask != 0  # [N, L]
    total = torch.where(keep, values, torch.zeros_like(values)).sum(-1)  # [N]
    return total / keep.sum(-1).clamp(min=1).to(values.dtype)


def trajectory_entropy(entropy_tok: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """ExGRPO trajectory entropy H(o) = (1/|o|) sum_{t in o} H_t over the response's own tokens.

    Prompt and padding positions are excluded whatever their values; an empty response gives 0.

    Example: entropies [[9, 1, 2, 5]] with response mask [[0, 1, 1, 0]] -> [1.5].

    Args:
        entropy_tok: [N, L] per-token entropies; response_mask: [N, L] True on response tokens.

    Returns:
        [N] H(o) per row.
    """
    return _response_mean(entropy_tok, response_mask)


def trajectory_nll(logp_tok: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Mean NLL -(1/|o|) sum_{t in o} log pi(o_t) (paper Algorithm 1; the `nll` ablation). [N, L] -> [N]."""
    return _response_mean(-logp_tok, response_mask)
