"""Padding-free micro-batches: a micro-batch's rows run as one sequence of their real tokens, each row
with its own position ids (0, 1, ...) and attention only within itself, so the forward and backward
compute on real tokens only (executed = useful FLOPs) and every index is known on the host before
the forward (no host sync inside a micro-batch).

Attention over the packed sequence is `packed_attention_forward`, registered with transformers as
"exgrpo_packed" and switched on for the packed forward only: on CUDA in bf16/fp16 it is torch's
`varlen_attn` (FlashAttention over cumulative sequence lengths), elsewhere one causal SDPA call per
row. transformers' own route (position ids with no attention mask) builds a block-diagonal mask and
reads a value back each forward; this one needs no mask. Grouped-query heads are never expanded.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from dataclasses import dataclass

import torch
import torch.nn.functional as F

ATTENTION = "exgrpo_packed"


def row_spans(batch) -> list[tuple[int, int, int, int]]:
    """(first real column, real tokens, first response column, response tokens) of every row, read in one
    host transfer. Each mask must be one contiguous run per row (left or right padding): else
    `policy.PolicyInputError`."""
    am, rm = batch.attention_mask != 0, batch.response_mask != 0
    width = am.shape[-1]

    def extent(m):  # first True column, count, last True column (+1)
        return [m.int().argmax(-1), m.sum(-1), width - m.flip(-1).int().argmax(-1)]

    got = torch.stack(extent(am) + extent(rm), dim=1).tolist()  # [n, 6]
    for row, (f, n, end, rf, rn, rend) in enumerate(got):
        if (n and end - f != n) or (rn and rend - rf != rn):
            from exgrpo_core.training.policy import PolicyInputError

            raise PolicyInputError(f"row {row}: its attention or response mask has holes; only left or right "
                                   "padding (one contiguous run of real tokens) is supported")
    return [(f, n, rf, rn) for f, n, _, rf, rn, _ in got]


@dataclass
class Packed:
    """Host-built indices of one packed micro-batch of n rows, width `width` (its longest row's end)."""

    src: torch.Tensor  # [S] flat index into the micro-batch's [n, width] ids of each packed token
    pos: torch.Tensor  # [S] its position id within its row
    cu: torch.Tensor  # [n + 1] int32 cumulative row lengths (rows with no token are skipped)
    lens: list[int]  # tokens of each packed row
    at: torch.Tensor  # [M] packed index of the hidden state that predicts each scored token
    tgt: torch.Tensor  # [M] flat index into [n, width] of each scored token (its id and its output slot)
    n: int
    width: int

    @property
    def tokens(self) -> int:
        return int(self.src.numel())


def pack(spans: list[tuple[int, int, int, int]], device) -> Packed:
    """Indices of the rows with these `row_spans`, packed in order. A row's response token at column c is
    scored when c - 1 is real (a row's first token predicts nothing), as in `policy.token_logprobs_and_entropy`."""
    width = max((f + n for f, n, _, _ in spans), default=0)
    src, pos, at, tgt, lens = [], [], [], [], []
    offset = 0
    for i, (first, length, rstart, rlen) in enumerate(spans):
        if length == 0:
            continue
        src.extend(range(i * width + first, i * width + first + length))
        pos.extend(range(length))
        lo = max(rstart, first + 1)
        for c in range(lo, rstart + rlen):
            at.append(offset + c - 1 - first)
            tgt.append(i * width + c)
        lens.append(length)
        offset += length
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)

    def t(x, dtype=torch.long):
        return torch.tensor(x, dtype=dtype).to(device, non_blocking=True)

    return Packed(src=t(src), pos=t(pos), cu=t(cu, torch.int32), lens=lens, at=t(at), tgt=t(tgt),
                  n=len(spans), width=width)


def executed_tokens(lengths: list[int], micro_rows: list[list[int]], packed: bool) -> int:
    """Tokens a training forward runs: rows x the longest row per padded micro-batch, or the real tokens
    when packed. Divided by sum(lengths) it is executed over useful FLOPs (matrix multiplies; PaLM's
    per-token convention, training/flops.py)."""
    if packed:
        return sum(lengths[r] for rows in micro_rows for r in rows)
    return sum(len(rows) * max(lengths[r] for r in rows) for rows in micro_rows if rows)


def packed_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                             scaling: float | None = None, **kwargs):
    """Causal attention within each packed row: query [1, Hq, S, D], key / value [1, Hkv, S, D] ->
    ([1, S, Hq, D], None). Needs `exgrpo_packed` (a `Packed`) in the forward's keyword arguments."""
    p: Packed = kwargs["exgrpo_packed"]
    gqa = query.shape[1] != key.shape[1]
    dtype = query.dtype if query.dtype in (torch.bfloat16, torch.float16) else (
        torch.get_autocast_dtype("cuda") if query.is_cuda and torch.is_autocast_enabled("cuda") else None)
    if query.is_cuda and dtype is not None and _varlen() is not None:  # as SDPA would under autocast
        q, k, v = (x[0].transpose(0, 1).to(dtype).contiguous() for x in (query, key, value))  # [S, H, D]
        longest = max(p.lens, default=1)
        gqa_kw = {"enable_gqa": gqa} if _varlen_takes_gqa() else {}
        if gqa and not gqa_kw:  # (torch < 2.12: no enable_gqa; K/V repeated per query head, as SDPA would)
            k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))
        out = _varlen()(q, k, v, p.cu, p.cu, longest, longest, scale=scaling, window_size=(-1, 0), **gqa_kw)
        return out.unsqueeze(0), None
    outs, start = [], 0
    for n in p.lens:
        part = slice(start, start + n)
        outs.append(F.scaled_dot_product_attention(query[:, :, part], key[:, :, part], value[:, :, part],
                                                   is_causal=True, scale=scaling, enable_gqa=gqa))
        start += n
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous(), None


@functools.cache
def _varlen_takes_gqa() -> bool:
    return "enable_gqa" in inspect.signature(_varlen()).parameters


def _varlen():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, packed_attention_forward)


_register()


def packed_attention(model):
    """While active, the model's attention layers run `packed_attention_forward` (and build no mask).
    The backward of a packed forward must run inside it too: gradient checkpointing recomputes layers there."""
    from exgrpo_core.training.forward_parts import attention_as

    return attention_as(model, ATTENTION)


def packed_logprobs_and_entropy(model, ids: torch.Tensor, p: Packed, *, with_entropy: bool, temperature: float = 1.0,
                                chunk_positions: int = 1024) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log pi(x_t | x_<t) and entropy H_t (docs/implementation_details.md) of a packed micro-batch:
    `ids` [n, width] as `pack` indexed them -> [n, width] float32 each, 0 where nothing is scored.
    The values of `policy.token_logprobs_and_entropy` (score_mask = the response mask), up to rounding."""
    from exgrpo_core.training.forward_parts import head_at
    from exgrpo_core.training.policy import _block_scores, split_blocks

    flat_ids = ids.reshape(-1)
    seq = flat_ids.index_select(0, p.src)[None]  # [1, S]
    targets = flat_ids.index_select(0, p.tgt)  # [M]
    with packed_attention(model), head_at(model, torch.zeros_like(p.at), p.at, (1, p.tokens)) as tap:
        logits = model(input_ids=seq, position_ids=p.pos[None], use_cache=False, exgrpo_packed=p).logits
    flat = logits[0] if tap.hit else logits[0].index_select(0, p.at)  # [M, V]
    pieces = [_block_scores(b, t, temperature, with_entropy)
              for b, t in zip(split_blocks(flat, chunk_positions), targets.split(chunk_positions))]

    def place(values: list[torch.Tensor]) -> torch.Tensor:
        x = torch.zeros(p.n * p.width, dtype=torch.float32, device=ids.device)
        if values:
            x = x.index_put((p.tgt,), torch.cat(values))
        else:  # nothing scored: zeros that still reach the graph, so backward() works
            x = x + logits.sum().float() * 0.0
        return x.view(p.n, p.width)

    return place([q[0] for q in pieces]), (place([q[1] for q in pieces]) if with_entropy else None)


def micro_batches(lengths: list[int], size: int, max_tokens: int | None = None) -> list[list[int]]:
    """Rows in packed micro-batches of at most `size` rows and `max_tokens` real tokens, shortest first (a
    row longer than `max_tokens` goes alone). Example: lengths [9, 3, 8, 2], size 3, max_tokens 12 ->
    [[3, 1], [2], [0]]."""
    out: list[list[int]] = []
    used = 0
    for i in sorted(range(len(lengths)), key=lambda r: lengths[r]):
        if not out or len(out[-1]) >= size or (max_tokens is not None and used + lengths[i] > max_tokens):
            out.append([])
            used = 0
        out[-1].append(i)
        used += lengths[i]
    return out
