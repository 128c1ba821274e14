"""The GPU sampling path: a low-precision inference copy of the policy and fixed-shape decode steps.

- **Inference copy** (`InferenceCopy`): a second module of the policy's class in bf16 (by default),
  its weights copied from the trainer's masters at a `generate` call when they may have changed since
  the last copy (`weights_version`: an optimiser step, a loaded checkpoint), so evaluation calls
  between two steps copy nothing (sharded FSDP2 parameters are gathered once there). Decoding never touches the float32 masters,
  Accelerate's autocast wrapper or an FSDP2 module, whose layers would be re-gathered every step.
- **Fixed shapes** (`static_decode`): a transformers `StaticCache` sized for the batch (rows padded to a
  bucket, length rounded up), the decoder's own 4-D mask buffer, and every step the same tensors in and
  out, so on CUDA the step (forward and sampler) runs under `torch.compile(mode="reduce-overhead")`,
  captured in a CUDA graph (one per length bucket: a step attends over the cache's first 128 x 2^k
  positions that cover the filled ones, not the whole cache). Finished rows stay in the batch (fed the pad token, outputs masked); the
  only host sync is the end check every `check_every` steps. On the CPU the same step runs eagerly.
- **GQA without the expanded copy** (`gqa_sdpa`): one query token's heads are grouped by their key head
  ([b, kv_heads, groups, d]) and SDPA attends over the cache as it is, with the mask. transformers' own
  SDPA path does the same grouping eagerly but copies K/V to every query head under `torch.compile`.

The sampler is `decode.sample_step` (the same processed distribution and inverse CDF as the eager
decoder, the same uniforms per step), so the tokens match the eager decoder's up to the copy's rounding.
transformers' continuous batching (`generate_batch`, `return_logprobs`) was not used: it returns the
sampled token's log-prob only (no entropy) and draws with `torch.multinomial`, not our seeded uniforms.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch.optim.optimizer import register_optimizer_step_post_hook
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.cache_utils import StaticCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

from exgrpo_core.rollout.decode import Sampled, draw_uniforms, sample_step
from exgrpo_core.training.forward_parts import cache_kw

ATTENTION = "exgrpo_gqa_sdpa"


def gqa_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers attention function: for one query token, SDPA on the key/value heads as cached (query
    heads grouped per key head, the [b, 1, 1, L] mask broadcast) over the first L cached positions (L the
    mask's length: `StaticDecoder`'s length bucket); otherwise transformers' SDPA."""
    groups = getattr(module, "num_key_value_groups", 1)
    b, h, q, d = query.shape
    if q == 1 and attention_mask is not None and attention_mask.shape[-1] < key.shape[-2]:  # a length bucket:
        key, value = key[:, :, :attention_mask.shape[-1]], value[:, :, :attention_mask.shape[-1]]  # the keys it covers
    if groups == 1 or q != 1 or attention_mask is None or attention_mask.shape[1] != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    out = F.scaled_dot_product_attention(query.reshape(b, h // groups, groups, d), key, value,
                                         attn_mask=attention_mask, scale=scaling)
    return out.reshape(b, h, 1, d).transpose(1, 2).contiguous(), None


AttentionInterface.register(ATTENTION, gqa_sdpa)
AttentionMaskInterface.register(ATTENTION, sdpa_mask)


def _full(t: torch.Tensor) -> torch.Tensor:
    """A parameter's whole value (an FSDP2 DTensor is gathered: a collective every process runs)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _plain_class(module) -> type:
    """The module's own class (FSDP2's `fully_shard` swaps in a subclass `FSDP<cls>`)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without FSDP2
        return type(module)
    return next(c for c in type(module).__mro__ if not issubclass(c, FSDPModule))


OPTIMISER_STEPS = [0]
"""Optimiser steps taken in this process (any optimiser), counted by a global step hook."""


def _count_step(*_args) -> None:
    OPTIMISER_STEPS[0] += 1


register_optimizer_step_post_hook(_count_step)


def weights_version(master) -> tuple:
    """A value that changes when the masters may have: the optimiser steps taken (the fused AdamW step
    writes parameters without bumping their tensor versions) and, per parameter, its version (bumped
    by `load_state_dict` and other in-place writes) and address (moved by `p.data = ...`). Read on the
    host, no device sync."""
    return OPTIMISER_STEPS[0], tuple((p._version, getattr(p, "_local_tensor", p).data_ptr())  # (DTensor: its shard)
                                     for p in master.parameters())


def _changed_anywhere(changed: bool, master) -> bool:
    """`changed` on any process when the masters are FSDP2-sharded (gathering is a collective: every
    process must refresh, or none), else `changed`."""
    if not any(hasattr(p, "full_tensor") for p in master.parameters()):
        return changed
    from exgrpo_core.training.distributed import all_reduce_max

    return all_reduce_max(float(changed)) > 0


class InferenceCopy:
    """The policy's weights in `dtype` in a module of its own class, refreshed from the masters when
    they changed since the last refresh."""

    def __init__(self, dtype: torch.dtype = torch.bfloat16):
        self.dtype = dtype
        self.module = None
        self.refreshes = 0  # weight copies made
        self.version = None  # the masters' `weights_version` at the last copy

    @torch.no_grad()
    def refresh(self, master, device: torch.device, force: bool = False):
        """The copy (built on first use) with every parameter set to the masters' cast to `dtype`; buffers
        (rotary frequencies) are copied as they are. Nothing is copied when the masters are as they were
        at the last refresh (`weights_version`), unless `force`."""
        version = weights_version(master)
        if self.module is None or next(self.module.parameters()).device != device:
            self.version = None
            config = copy.deepcopy(master.config)
            config._attn_implementation = ATTENTION
            with torch.device("meta"):
                module = _plain_class(master)(config)
            module.to_empty(device=device)
            module.to(self.dtype)
            if hasattr(module, "tie_weights"):
                module.tie_weights()  # to_empty gives each module its own tensor: tied embeddings come apart
            for name, buf in master.named_buffers():
                owner, _, leaf = name.rpartition(".")
                module.get_submodule(owner)._buffers[leaf] = buf.detach().to(device, copy=True)
            module.eval().requires_grad_(False)
            self.module = module
        if not _changed_anywhere(force or version != self.version, master):
            return self.module
        mine = dict(self.module.named_parameters())
        theirs = dict(master.named_parameters())
        if mine.keys() != theirs.keys():
            raise ValueError(f"inference copy: parameters differ from the policy's ({sorted(mine.keys() ^ theirs.keys())[:3]})")
        for name, p in theirs.items():
            mine[name].copy_(_full(p.detach()))
        self.refreshes += 1
        self.version = version
        return self.module


class StaticDecoder:
    """Fixed-shape decoding on a (copied) model: caches and the step function kept per batch shape."""

    def __init__(self, compile_step: bool | None = None, length_bucket: int = 128):
        self.compile_step = compile_step  # None: on CUDA only
        self.length_bucket = length_bucket
        self.attend_buckets = True  # a step attends over its length bucket of the cache, not all of it
        self.caches: dict = {}
        self.steps: dict = {}

    def _cache(self, model, rows: int, length: int) -> tuple[StaticCache, int]:
        """A cache of `rows` x at least `length` positions and its length: the last one (reset) when it is
        long enough, so a shorter call reuses the captured shapes; else a new one (the old one freed)."""
        key, had = (id(model), rows), self.caches.get((id(model), rows))
        if had is not None and had[1] >= length:
            had[0].reset()
            return had
        self.caches.clear()  # one batch shape at a time in memory
        self.caches[key] = (StaticCache(config=model.config, max_cache_len=length), length)
        return self.caches[key]

    def span(self, filled: int, length: int) -> int:
        """Cache positions a step with `filled` of them in use attends over: `length_bucket` x the next power
        of two that covers them (at most `length`), so a call compiles at most log2(length / bucket) + 1 steps."""
        if not self.attend_buckets:
            return length
        buckets = math.ceil(filled / self.length_bucket)
        return min(length, self.length_bucket * (1 << max(0, buckets - 1).bit_length()))

    def _step(self, model, device, **sampling):
        key = (id(model), device.type, tuple(sorted(sampling.items())))
        kw = cache_kw(model)
        if key not in self.steps:
            def step(tok, pos, mask, cache, u):
                out = model(input_ids=tok, attention_mask=mask, position_ids=pos, **{kw: cache},
                            use_cache=True, logits_to_keep=1)
                return sample_step(out.logits[:, -1].float(), u, **sampling)
            use = self.compile_step if self.compile_step is not None else device.type == "cuda"
            self.steps[key] = torch.compile(step, mode="reduce-overhead") if use else step
        return self.steps[key]

    @torch.no_grad()
    def decode(self, model, ids: torch.Tensor, mask: torch.Tensor, *, temperature: float, top_p: float = 1.0,
               top_k: int = 0, max_new_tokens: int, eos_ids: list[int], pad_id: int, scores: bool = True,
               uniforms: torch.Tensor | None = None, check_every: int = 16, rows: int | None = None) -> Sampled:
        """`decode.decode`'s result for left-padded ids / mask [n, w], at fixed shapes: the batch padded
        to `rows` (default n), the cache to w + max_new_tokens rounded up to `length_bucket` (or the last
        call's cache when it is longer: warm up with the longest call)."""
        n, w = ids.shape
        device = ids.device
        big = max(n, rows or n)
        length = math.ceil((w + max_new_tokens) / self.length_bucket) * self.length_bucket
        ids = F.pad(ids, (0, 0, 0, big - n), value=pad_id)
        mask = F.pad(mask.bool(), (0, 0, 0, big - n), value=True)  # dummy rows: all pad tokens, all seen
        cache, length = self._cache(model, big, length)
        att = torch.zeros(big, 1, 1, length, dtype=torch.bool, device=device)
        att[:, 0, 0, :w] = mask
        pos = mask.long().cumsum(-1) - 1
        if w > 1:  # prefill: causal over each row's real tokens, a padding query sees itself (no empty row)
            causal = torch.ones(w - 1, length, dtype=torch.bool, device=device).tril()
            pre = (causal & att[:, :, 0]) | torch.eye(w - 1, length, dtype=torch.bool, device=device)
            model(input_ids=ids[:, :-1], attention_mask=pre[:, None], position_ids=pos[:, :-1].masked_fill(~mask[:, :-1], 1),
                  **{cache_kw(model): cache}, use_cache=True, logits_to_keep=1)
        step = self._step(model, device, temperature=temperature, top_k=top_k, top_p=top_p, scores=scores)
        eos = torch.tensor(eos_ids, device=device)
        tokens = torch.full((n, max_new_tokens), pad_id, dtype=torch.long, device=device)
        logps = torch.zeros(n, max_new_tokens, device=device)
        ents = torch.zeros(n, max_new_tokens, device=device)
        tok = ids[:, -1:].clone()
        p = pos[:, -1:].clone()
        running = torch.arange(big, device=device) < n
        u = torch.zeros(big, dtype=torch.float64, device=device)
        steps = 0
        for t in range(max_new_tokens):
            steps = t + 1
            att[:, 0, 0, w - 1 + t] = True
            u[:n] = draw_uniforms(n, device=device) if uniforms is None else uniforms[t]
            if hasattr(torch.compiler, "cudagraph_mark_step_begin"):
                torch.compiler.cudagraph_mark_step_begin()
            new, logp, ent = step(tok, p, att[..., :self.span(w + t, length)], cache, u)  # positions 0 .. w-1+t
            new = torch.where(running, new, pad_id)
            tokens[:, t] = new[:n]
            if scores:
                logps[:, t] = torch.where(running, logp, 0.0)[:n]
                ents[:, t] = torch.where(running, ent, 0.0)[:n]
            running = running & ~(new[:, None] == eos).any(-1)
            tok, p = new[:, None], p + 1
            if steps % max(1, check_every) == 0 and not torch.nonzero(running).numel():  # the only host sync
                break
        return Sampled(tokens[:, :steps], logps[:, :steps], ents[:, :steps], big * steps)
