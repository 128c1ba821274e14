"""Scoring forwards that compute less than the whole [N, L] grid, with the same values and gradients.

- `head_at`: the output head (vocabulary projection) runs on the scored positions' hidden states only.
- `shared_prompt_logits`: rows with the same prompt (the K responses of a question, a replayed
  trajectory beside them) run that prompt through the model once; its key/value cache is copied to
  the rows, which then run only their responses. Gradients flow back through the copies into the one
  prompt forward, so the sum over rows is the same as K separate prompt forwards, up to rounding.
"""

from __future__ import annotations

import contextlib
import inspect

import torch


class HeadTap:
    armed = False  # a pre-hook sits on the output head
    hit = False  # the head ran on the gathered positions


@contextlib.contextmanager
def head_at(model, rows: torch.Tensor, cols: torch.Tensor, shape: tuple[int, int]):
    """While active, the output head sees only the hidden states at (rows, cols) of the [n, l] input,
    as one [1, M, H] sequence: the vocabulary projection and its backward run on the scored positions
    only, not on the padding between rows of different lengths. `tap.hit` tells whether that happened;
    a model that does not call its output-embedding module on [n, l, H] is left alone.
    """
    tap, head = HeadTap(), output_head(model)
    if head is None or rows.numel() == 0:
        yield tap
        return

    def pre_hook(_module, args):
        hidden = args[0]
        if tap.hit or hidden.dim() != 3 or tuple(hidden.shape[:2]) != shape:
            return None
        tap.hit = True
        return (hidden[rows, cols].unsqueeze(0), *args[1:])

    handle = head.register_forward_pre_hook(pre_hook)
    tap.armed = True
    try:
        yield tap
    finally:
        handle.remove()


def output_head(model):
    inner = getattr(model, "module", model)
    get = getattr(inner, "get_output_embeddings", None)
    head = get() if callable(get) else None
    return head if isinstance(head, torch.nn.Module) else None


def takes_logits_to_keep(model) -> bool:
    """Whether the causal LM's forward accepts `logits_to_keep` (transformers models do; test fakes may not)."""
    forward = getattr(model, "module", model).forward
    try:
        return "logits_to_keep" in inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return False


def cache_kw(model) -> str:
    """The forward's key/value cache keyword: `cache` since transformers renamed `past_key_values`
    (passing the old name warns on every call), else `past_key_values`."""
    forward = getattr(model, "module", model).forward
    try:
        return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"
    except (TypeError, ValueError):
        return "past_key_values"


def cache_of(out):
    """The key/value cache a forward returned (`out.cache`, formerly `out.past_key_values`), or None."""
    return out.cache if hasattr(out, "cache") else getattr(out, "past_key_values", None)


def can_share_prompts(model) -> bool:
    """Two forwards (prompt, then responses on its cache) before one backward: not with gradient
    checkpointing (transformers drops the cache in training) nor FSDP2 (one forward per backward)."""
    inner = getattr(model, "module", model)
    checkpointing = getattr(inner, "is_activation_checkpointing", None)  # transformers 5; older: is_gradient_...
    if checkpointing is None:
        checkpointing = getattr(inner, "is_gradient_checkpointing", False)
    if checkpointing and inner.training:
        return False
    return not hasattr(inner, "set_requires_gradient_sync") and output_head(model) is not None


def copied_prompt_cache(model, ids: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor,
                        which: torch.Tensor):
    """Run each distinct prompt (a row of `ids`) once, keeping no logits but the last position's, and
    copy its key/value cache to the rows `which` maps onto it; None when the model keeps no cache
    that can be copied. Shared by sampling (rollout.py) and scoring (`shared_prompt_logits`)."""
    keep = {"logits_to_keep": 1} if takes_logits_to_keep(model) else {}
    out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids, use_cache=True, **keep)
    cache = cache_of(out)
    if cache is None or not hasattr(cache, "batch_select_indices"):
        return None
    cache.batch_select_indices(which)
    return cache


def shared_prompt_logits(model, ids: torch.Tensor, am: torch.Tensor, rows: torch.Tensor,
                         cols: torch.Tensor) -> torch.Tensor | None:
    """[M, V] logits at the scored positions, column cols[i] of row rows[i] of `ids` [n, l] (it predicts
    token cols[i] + 1), computing each distinct prompt once; None when no prompt repeats.

    A row's prompt is its real tokens before its first scored column; the row's part from that column
    to its last real token is its continuation. Prompts are left-padded into one batch, continuations
    right-padded into another that attends to the copied cache; position ids count real tokens, as a
    single padded row would.
    """
    used = torch.unique(rows)  # rows with something scored, ascending
    c0 = torch.full((ids.shape[0],), ids.shape[1], dtype=torch.long, device=ids.device)
    c0.scatter_reduce_(0, rows, cols, reduce="amin")
    real = am != 0
    end = real.shape[1] - real.flip(1).long().argmax(1)  # [n] one past the last real column
    prompts = [tuple(ids[r, :c0[r]][real[r, :c0[r]]].tolist()) for r in used.tolist()]
    slot = {p: i for i, p in enumerate(dict.fromkeys(prompts))}  # distinct prompts in first-seen order
    distinct = list(slot)
    if len(distinct) == len(prompts) or min(len(p) for p in distinct) == 0:
        return None
    which = torch.tensor([slot[p] for p in prompts], device=ids.device)  # used row -> prompt
    width = max(len(p) for p in distinct)
    pre_ids = torch.zeros(len(distinct), width, dtype=torch.long, device=ids.device)
    pre_mask = torch.zeros_like(pre_ids)
    for j, p in enumerate(distinct):  # left padding: every prompt ends at the last column
        pre_ids[j, width - len(p):] = torch.tensor(p, device=ids.device)
        pre_mask[j, width - len(p):] = 1
    pre_pos = (pre_mask.cumsum(-1) - 1).clamp(min=0)
    cache = copied_prompt_cache(model, pre_ids, pre_mask, pre_pos, which)  # [m, ...]: a differentiable gather
    if cache is None:
        return None
    starts, ends = c0[used], end[used]
    span = int((ends - starts).max())
    grid = starts[:, None] + torch.arange(span, device=ids.device)[None, :]  # [m, C] source columns
    inside = grid < ends[:, None]
    cont_ids = torch.where(inside, ids[used].gather(1, grid.clamp(max=ids.shape[1] - 1)), 0)
    lengths = torch.tensor([len(p) for p in prompts], device=ids.device)
    cont_pos = lengths[:, None] + torch.arange(span, device=ids.device)[None, :]
    mask = torch.cat([pre_mask[which], inside.long()], dim=1)  # [m, P + C]
    index = torch.full((ids.shape[0],), -1, dtype=torch.long, device=ids.device)
    index[used] = torch.arange(used.numel(), device=ids.device)
    c_rows, c_cols = index[rows], cols - c0[rows]  # scored positions in continuation coordinates
    with head_at(model, c_rows, c_cols, (used.numel(), span)) as tap:
        logits = model(input_ids=cont_ids, attention_mask=mask, position_ids=cont_pos, use_cache=True,
                       **{cache_kw(model): cache}).logits
    return logits[0] if tap.hit else logits[c_rows, c_cols]
