"""Scoring forwards that compute less than the whole [N, L] grid, with the same values and gradients.

- `head_at`: the output head (vocabulary projection) runs on the scored positions' hidden states only.
- `shared_prompt_logits`: rows with the same prompt (the K responses of a question, a replayed
  trajectory beside them) run that prompt through the model once; its key/value cache is copied to
  the rows, which then run only their responses. Gradients flow back through the copies into the one
  prompt forward, so the sum over rows is the same as K separate prompt forwards, up to rounding.
- `prompt_kv`: the distinct prompts' caches, the prefix they all start with (a system prompt) run
  once; `PromptKV.detached` lets several micro-batches use them and `backward` differentiate them once.
"""

from __future__ import annotations

import contextlib
import copy
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


UNMASKED = "exgrpo_sdpa_unmasked"
"""transformers' own SDPA attention under a name without a mask function: the model then builds no mask
and passes the one it is given (4-D, or None: causal) as it is (`policy._host_mask`)."""


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    AttentionInterface.register(UNMASKED, sdpa_attention_forward)


_register()


@contextlib.contextmanager
def attention_as(model, name: str):
    """While active, the model's attention layers run the attention function registered as `name`."""
    inner = getattr(model, "module", model)
    configs = [m.config for m in inner.modules() if hasattr(m, "config") and hasattr(m.config, "_attn_implementation")]
    configs = list({id(c): c for c in configs}.values())
    saved = [c._attn_implementation for c in configs]
    for c in configs:
        c._attn_implementation = name
    try:
        yield
    finally:
        for c, was in zip(configs, saved):
            c._attn_implementation = was


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
    that can be copied. Used by sampling (rollout.py)."""
    keep = {"logits_to_keep": 1} if takes_logits_to_keep(model) else {}
    out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids, use_cache=True, **keep)
    cache = cache_of(out)
    if cache is None or not hasattr(cache, "batch_select_indices"):
        return None
    cache.batch_select_indices(which)
    return cache


class PromptKV:
    """Key/value caches of distinct prompts (tuples of token ids), one row each: `mask` [d, W] is
    their attention mask (common prefix, padding, remainder), `lengths` [d] their real tokens.

    `detached()` gives a copy whose cache tensors are graph leaves: forwards on its copies (one per
    micro-batch) accumulate gradients there, and `backward()` then sends them through the prompt
    forward once. The sum is the same as differentiating every micro-batch through its own copy.
    """

    def __init__(self, cache, mask: torch.Tensor, slots: dict[tuple, int], source=None):
        self.cache, self.mask, self.slots, self.source = cache, mask, slots, source
        self.lengths = torch.tensor([len(p) for p in slots], device=mask.device)

    def detached(self) -> "PromptKV":
        leaves = [(k.detach().requires_grad_(k.requires_grad), v.detach().requires_grad_(v.requires_grad))
                  for k, v in _tensors(self.cache)]
        return PromptKV(_with_tensors(self.cache, leaves), self.mask, self.slots, source=self)

    def rows(self, which: torch.Tensor):
        """A new cache holding row which[i] at row i (differentiable: index_select)."""
        out = _with_tensors(self.cache, _tensors(self.cache))
        out.batch_select_indices(which)
        return out

    def backward(self) -> None:
        """Send the gradients gathered on a detached copy's leaves through the prompt forward."""
        outs, grads = [], []
        for pair, leaves in zip(_tensors(self.source.cache), _tensors(self.cache)):
            for t, leaf in zip(pair, leaves):
                if leaf.grad is not None:
                    outs.append(t)
                    grads.append(leaf.grad)
        if outs:
            torch.autograd.backward(outs, grads)


def _tensors(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def _with_tensors(cache, tensors):
    out = copy.copy(cache)
    out.layers = []
    for layer, (k, v) in zip(cache.layers, tensors):
        new = copy.copy(layer)
        new.keys, new.values = k, v
        out.layers.append(new)
    return out


def prompt_kv(model, prompts: list[tuple], device, min_prefix: int = 2) -> PromptKV | None:
    """Caches of the distinct `prompts`, the prefix they all start with (`min_prefix`+ tokens) run
    once as one row and copied to each prompt's remainder; None when no prompt repeats and there is
    no such prefix, a prompt is empty, or the model keeps no cache with the needed layout.

    Layout [d, P + r] as in sampling's prefix prefill: the prefix (positions 0..P-1), then each
    remainder left-padded to r columns; position ids count real tokens.
    """
    distinct = list(dict.fromkeys(prompts))
    if not distinct or min(len(p) for p in distinct) == 0:
        return None
    first, shortest = distinct[0], min(len(p) for p in distinct)
    common = 0
    while common < shortest - 1 and all(p[common] == first[common] for p in distinct):
        common += 1
    if common < min_prefix or len(distinct) == 1:
        common = 0
    if common == 0 and len(distinct) == len(prompts):
        return None
    keep = {"logits_to_keep": 1} if takes_logits_to_keep(model) else {}
    r = max(len(p) - common for p in distinct)
    ids = torch.zeros(len(distinct), common + r, dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    ids[:, :common] = torch.tensor(first[:common], dtype=torch.long, device=device)
    mask[:, :common] = 1
    for j, p in enumerate(distinct):
        ids[j, common + r - (len(p) - common):] = torch.tensor(p[common:], device=device)
        mask[j, common + r - (len(p) - common):] = 1
    cache = None
    if common:
        cache = cache_of(model(input_ids=ids[:1, :common], attention_mask=mask[:1, :common],
                               position_ids=torch.arange(common, device=device)[None], use_cache=True, **keep))
        if cache is None or not hasattr(cache, "batch_select_indices") or not hasattr(cache, "layers"):
            return None
        cache.batch_select_indices(torch.zeros(len(distinct), dtype=torch.long, device=device))
    pos = (mask.cumsum(-1) - 1).clamp(min=0)[:, common:]
    cache = cache_of(model(input_ids=ids[:, common:], attention_mask=mask, position_ids=pos, use_cache=True,
                           **({cache_kw(model): cache} if cache is not None else {}), **keep))
    if cache is None or not hasattr(cache, "batch_select_indices") or not hasattr(cache, "layers"):
        return None
    return PromptKV(cache, mask, {p: j for j, p in enumerate(distinct)})


def scored_prompts(ids: torch.Tensor, am: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor):
    """(used rows ascending, first scored column c0 [n], prompt tuples of the used rows): a row's
    prompt is its real tokens before its first scored column (cols[i] of row rows[i])."""
    used = torch.unique(rows)
    c0 = torch.full((ids.shape[0],), ids.shape[1], dtype=torch.long, device=ids.device)
    c0.scatter_reduce_(0, rows, cols, reduce="amin")
    real = am != 0
    prompts = [tuple(ids[r, :c0[r]][real[r, :c0[r]]].tolist()) for r in used.tolist()]
    return used, c0, prompts


def batch_prompts(ids: torch.Tensor, am: torch.Tensor, score_mask: torch.Tensor) -> list[tuple | None]:
    """Each row's prompt as `shared_prompt_logits` sees it (real tokens before the column that
    predicts its first scored token); None for a row with nothing scored. One host transfer."""
    n, width = ids.shape
    valid = (am[:, 1:] != 0) & (am[:, :-1] != 0) & (score_mask[:, 1:] != 0)  # [n, width-1]
    c0 = torch.where(valid.any(-1), valid.int().argmax(-1), width)  # [n]: first scored column (width: none)
    host = torch.cat([ids.long(), (am != 0).long(), c0[:, None].long()], 1).tolist()  # [n, 2 width + 1]
    out: list[tuple | None] = []
    for row in host:
        c = row[-1]
        out.append(tuple(t for t, real in zip(row[:c], row[width:width + c]) if real) if c < width else None)
    return out


def shared_prompt_logits(model, ids: torch.Tensor, am: torch.Tensor, rows: torch.Tensor,
                         cols: torch.Tensor, prompts: PromptKV | None = None,
                         host: tuple[list[int], list[int], list[int], list[tuple]] | None = None) -> torch.Tensor | None:
    """[M, V] logits at the scored positions, column cols[i] of row rows[i] of `ids` [n, l] (it predicts
    token cols[i] + 1), each distinct prompt's cache computed once (`prompt_kv`, or taken from
    `prompts` when it holds every row's prompt); None when nothing is shared.

    A row's prompt is its real tokens before its first scored column; the row's part from that column
    to its last scored column is its continuation, right-padded into a batch that attends to its prompt's
    copied cache; position ids count real tokens, as a single padded row would.
    `host`: (used rows ascending, their first and one-past-last scored columns, their prompts) when the
    caller knows them: then nothing is read back from the device.
    """
    if host is None:
        used, c0, row_prompts = scored_prompts(ids, am, rows, cols)
        end = torch.zeros_like(c0).scatter_reduce_(0, rows, cols + 1, reduce="amax")  # one past the last scored
        starts, ends = c0[used], end[used]  # a row's last token predicts nothing: it is not run
        span = int((ends - starts).max())
    else:
        used_at, first_at, end_at, row_prompts = host
        span = max(e - f for f, e in zip(first_at, end_at))
        used, starts, ends = (torch.tensor(x, dtype=torch.long).to(ids.device, non_blocking=True)
                              for x in (used_at, first_at, end_at))
        c0 = torch.full((ids.shape[0],), ids.shape[1], dtype=torch.long, device=ids.device).index_put((used,), starts)
    if prompts is None or any(p not in prompts.slots for p in row_prompts):
        prompts = prompt_kv(model, row_prompts, ids.device)
    if prompts is None:
        return None
    which = torch.tensor([prompts.slots[p] for p in row_prompts], device=ids.device)  # used row -> prompt
    cache = prompts.rows(which)  # [m, ...]: a differentiable gather
    grid = starts[:, None] + torch.arange(span, device=ids.device)[None, :]  # [m, C] source columns
    inside = grid < ends[:, None]
    cont_ids = torch.where(inside, ids[used].gather(1, grid.clamp(max=ids.shape[1] - 1)), 0)
    cont_pos = prompts.lengths[which][:, None] + torch.arange(span, device=ids.device)[None, :]
    mask = torch.cat([prompts.mask[which], inside.long()], dim=1)  # [m, W + C]
    index = torch.full((ids.shape[0],), -1, dtype=torch.long, device=ids.device)
    index[used] = torch.arange(used.numel(), device=ids.device)
    c_rows, c_cols = index[rows], cols - c0[rows]  # scored positions in continuation coordinates
    with head_at(model, c_rows, c_cols, (used.numel(), span)) as tap:
        logits = model(input_ids=cont_ids, attention_mask=mask, position_ids=cont_pos, use_cache=True,
                       **{cache_kw(model): cache}).logits
    return logits[0] if tap.hit else logits[c_rows, c_cols]
