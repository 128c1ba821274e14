"""The transformers engine's own decode loop: sampling that spends nothing on finished rows.

`generate` (transformers) keeps every row of a batch in every forward until the last row ends, draws
one exponential per vocabulary entry per row and step (`torch.multinomial`), and grows the key/value
cache by concatenation (the whole cache copied at every step). This loop:

- **drops rows as they finish** (EOS or the length limit): the cache, mask and positions of the rows
  still running are selected, so a step costs what its live rows cost;
- **samples by inverse CDF**: one uniform per row and step, compared with the cumulative sum of the
  probabilities (already needed for the entropy). The uniforms of a step are drawn for *every* row of
  the batch, finished or not, so the token a row gets does not depend on which other rows still run:
  with and without dropping rows the samples are the same for a fixed seed;
- **prefills shared tokens once** (`prefix_prefill`): the prefix every prompt of the batch starts
  with (a chat template's system prompt: 27 of cpu-demo's ~46 prompt tokens) runs once, each
  distinct prompt's remainder once on a copy of it, and the K samples of a prompt copy its cache;
- **writes the cache in place** (`GrowLayer`): each layer's keys / values live in a buffer with room
  for the whole response, and the model sees a view of the filled part.

Records are the same as before: token ids up to and including the first EOS, the sampler's
log-probs and entropies of the processed distribution (logits / temperature, then top-k / top-p),
`truncated` when the limit was hit without EOS. Logits processors given by the caller run on the raw
logits before the temperature.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from exgrpo_core.training.forward_parts import cache_kw, cache_of, takes_logits_to_keep


class GrowLayer(DynamicLayer):
    """A cache layer whose keys / values sit in a preallocated buffer [b, h, capacity, d]: `update`
    writes the new positions in place and `keys` / `values` are views of the filled part. It grows
    (one copy) only when a write would pass the capacity."""

    def __init__(self, reserve: int):
        super().__init__()
        self.reserve = reserve
        self.k_buf = self.v_buf = None
        self.filled = 0

    @classmethod
    def from_layer(cls, layer: DynamicLayer, reserve: int) -> "GrowLayer":
        new = cls(reserve)
        if layer.is_initialized and layer.keys is not None and layer.keys.numel():
            new.update(layer.keys, layer.values)
        return new

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        need = self.filled + key_states.shape[-2]
        if self.k_buf is None or need > self.k_buf.shape[-2]:
            b, h, _, d = key_states.shape
            k_buf = key_states.new_empty(b, h, need + self.reserve, d)
            v_buf = value_states.new_empty(b, h, need + self.reserve, value_states.shape[-1])
            if self.filled:
                k_buf[:, :, :self.filled] = self.k_buf[:, :, :self.filled]
                v_buf[:, :, :self.filled] = self.v_buf[:, :, :self.filled]
            self.k_buf, self.v_buf = k_buf, v_buf
        self.k_buf[:, :, self.filled:need] = key_states
        self.v_buf[:, :, self.filled:need] = value_states
        self.filled = need
        self.keys, self.values = self.k_buf[:, :, :need], self.v_buf[:, :, :need]
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Row i becomes row indices[i]: only rows that move are copied (in place), and the buffer is cut
        to len(indices) rows by a view. With `survivor_order` that is one copy per finished row."""
        if self.k_buf is not None:
            moved = torch.nonzero(indices != torch.arange(indices.numel(), device=indices.device)).flatten()
            if moved.numel():
                src = indices[moved]
                self.k_buf[moved] = self.k_buf[src]  # the right side is gathered before it is written
                self.v_buf[moved] = self.v_buf[src]
            self.k_buf, self.v_buf = self.k_buf[:indices.numel()], self.v_buf[:indices.numel()]
            self.keys, self.values = self.k_buf[:, :, :self.filled], self.v_buf[:, :, :self.filled]


def survivor_order(done: torch.Tensor) -> torch.Tensor:
    """Rows to keep, as indices: the first len(kept) positions, each finished one among them taking a
    kept row from the tail (swap-remove), so `GrowLayer` copies one row per finished row."""
    keep, _, _ = survivor_plan([not d for d in done.tolist()])
    return torch.tensor(keep, dtype=torch.long, device=done.device)


def survivor_plan(running: list[bool]) -> tuple[list[int], list[int], list[int]]:
    """(keep, holes, fills) on the host: `survivor_order`'s indices, and the kept positions that take a
    row from the tail (holes[i] <- fills[i]), the only rows a cache copies."""
    live = sum(running)
    holes = [i for i in range(live) if not running[i]]
    fills = [i for i in range(live, len(running)) if running[i]]
    keep = list(range(live))
    for h, f in zip(holes, fills):
        keep[h] = f
    return keep, holes, fills


def compact_cache(cache, keep: torch.Tensor, holes: torch.Tensor, fills: torch.Tensor) -> None:
    """`cache.batch_select_indices(keep)` with the moved rows known: `GrowLayer`s copy rows fills -> holes
    and cut the batch (no `nonzero` per layer); other layers select as usual."""
    layers = getattr(cache, "layers", None)
    if not isinstance(layers, list):
        cache.batch_select_indices(keep)
        return
    n = keep.numel()
    for layer in layers:
        if isinstance(layer, GrowLayer) and layer.k_buf is not None:
            if holes.numel():
                layer.k_buf[holes] = layer.k_buf[fills]
                layer.v_buf[holes] = layer.v_buf[fills]
            layer.k_buf, layer.v_buf = layer.k_buf[:n], layer.v_buf[:n]
            layer.keys, layer.values = layer.k_buf[:, :, :layer.filled], layer.v_buf[:, :, :layer.filled]
        else:
            layer.batch_select_indices(keep)


def growing_cache(cache, reserve: int):
    """`cache` (or a new one) with its plain dynamic layers turned into `GrowLayer`s; others are kept."""
    if cache is None:
        cache = DynamicCache()
    layers = getattr(cache, "layers", None)
    if isinstance(layers, list):
        cache.layers = [GrowLayer.from_layer(l, reserve) if type(l) is DynamicLayer else l for l in layers]
        if getattr(cache, "layer_class_to_replicate", None) is DynamicLayer:
            cache.layer_class_to_replicate = lambda: GrowLayer(reserve)
    return cache


def filter_logits(x: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask (to -inf) all but the `top_k` largest entries (0: all) and all but the smallest set of the
    largest entries whose probability reaches `top_p` (1: all); at least one entry is kept. x: [n, V]."""
    if 0 < top_k < x.shape[-1]:
        kth = torch.topk(x, top_k, dim=-1).values[:, -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        probs = torch.softmax(sorted_x, dim=-1)
        before = probs.cumsum(-1) - probs  # mass of the larger entries
        drop = before >= top_p
        drop[:, 0] = False
        x = x.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return x


def draw_uniforms(*shape: int, device=None) -> torch.Tensor:
    """The sampler's uniforms in [0, 1), float64: 53 random bits, so a token of mass 1e-8 is drawn at its
    rate (float32 uniforms step by 2^-24 ~ 6e-8)."""
    gen = getattr(_THREAD, "generator", None)  # a background sampler's own stream (rollout/overlap.py)
    return torch.rand(*shape, dtype=torch.float64, device=device, generator=gen)


_THREAD = threading.local()


@torch.compiler.disable  # (Inductor fails to generate this float64 scan over a 152k vocabulary: torch 2.11, H200)
def _cdf64(probs: torch.Tensor) -> torch.Tensor:
    return probs.cumsum(-1, dtype=torch.float64)


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Token j with cdf[j-1] <= u * total < cdf[j] for each row: a draw from `probs` [n, V] (or [1, V]
    shared by all) given uniforms u [n] in [0, 1). The CDF is summed in float64 (in float32, past a mass
    of ~0.5 a token under ~3e-8 adds nothing and is never drawn). Never an entry of probability 0, and
    no host sync: the target is kept below the total, and cdf[j] > cdf[j-1] means probs[j] > 0."""
    cdf = _cdf64(probs)
    total = cdf[:, -1:]
    target = torch.minimum(u.to(torch.float64).reshape(-1, 1) * total, torch.nextafter(total, torch.zeros_like(total)))
    if probs.shape[0] == 1 and u.numel() != 1:  # one distribution, many draws
        return torch.searchsorted(cdf[0], target.flatten(), right=True)
    return torch.searchsorted(cdf, target, right=True).squeeze(-1)


def prefix_prefill(model, prompts: list[list[int]], pad_id: int, min_prefix: int = 2):
    """The cache of every prompt but its last token, shared work done once: (ids, mask, cache) or None
    when nothing is shared (no common prefix of `min_prefix`+ tokens and no repeated prompt).

    Layout [n, P + r]: the common prefix (P columns, the same positions 0..P-1 in every row), then each
    row's remainder left-padded to r columns: padding sits between prefix and remainder, masked, and
    position ids count real tokens, so every row sees its own prompt. The prefix runs as one row, the
    distinct remainders (all but the last column) as one batch on copies of it, then rows copy the
    cache of their remainder.
    """
    n = len(prompts)
    first, shortest = prompts[0], min(len(p) for p in prompts)
    common = 0
    while common < shortest - 1 and all(p[common] == first[common] for p in prompts):
        common += 1
    if common < min_prefix:
        common = 0
    rests = [tuple(p[common:]) for p in prompts]
    slot = {r: i for i, r in enumerate(dict.fromkeys(rests))}
    if (common == 0 and len(slot) == n) or (n == 1 and common == 0):
        return None
    keep1 = {"logits_to_keep": 1} if takes_logits_to_keep(model) else {}
    device = next(model.parameters()).device
    r = max(len(x) for x in rests)
    ids = torch.full((n, common + r), pad_id, dtype=torch.long)
    mask = torch.zeros((n, common + r), dtype=torch.long)
    ids[:, :common] = torch.tensor(first[:common], dtype=torch.long)
    mask[:, :common] = 1
    for row, rest in enumerate(rests):
        ids[row, common + r - len(rest):] = torch.tensor(rest, dtype=torch.long)
        mask[row, common + r - len(rest):] = 1
    ids, mask = ids.to(device), mask.to(device)
    rows = torch.tensor([slot[x] for x in rests], device=device)  # row -> distinct remainder
    distinct = torch.tensor([rests.index(x) for x in slot], device=device)  # a row holding each remainder
    cache = None
    if common:
        cache = cache_of(model(input_ids=ids[:1, :common], attention_mask=mask[:1, :common],
                               position_ids=torch.arange(common, device=device)[None], use_cache=True, **keep1))
        if not hasattr(cache, "batch_select_indices"):
            return None
        cache.batch_select_indices(torch.zeros(len(slot), dtype=torch.long, device=device))
    if r > 1:  # the remainders but their last column, on the prefix
        m = mask[distinct, :-1]
        pos = (m.cumsum(-1) - 1).masked_fill(m == 0, 1)[:, common:]
        out = model(input_ids=ids[distinct, common:-1], attention_mask=m, position_ids=pos, use_cache=True,
                    **{cache_kw(model): cache}, **keep1)
        cache = cache_of(out)
    if cache is None or not hasattr(cache, "batch_select_indices"):
        return None
    cache.batch_select_indices(rows)
    return ids, mask, cache


@dataclass
class Sampled:
    """[n, T] each (T = steps run): tokens (pad after a row's end), log-probs and entropies (0 there)."""

    tokens: torch.Tensor
    logprobs: torch.Tensor
    entropies: torch.Tensor
    row_steps: int = 0
    """Row-steps computed (rows in the batch summed over steps): the decode work done."""


def sample_step(x: torch.Tensor, u: torch.Tensor, *, temperature: float, top_k: int, top_p: float,
                scores: bool) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(token, its log-prob, entropy) per row of logits x [n, V] (float32) given uniforms u [n]: the
    processed distribution (logits / temperature, then top-k / top-p), drawn by inverse CDF (temperature
    0: argmax). `scores=False`: the same token, no numbers (None)."""
    if scores:
        if temperature not in (0.0, 1.0):  # 0: greedy (evaluation only), numbers of the plain distribution
            x = x / temperature
        x = filter_logits(x, top_k, top_p)
        logp = torch.log_softmax(x, dim=-1)
        p = logp.exp()
        ent = -(p * logp.nan_to_num(neginf=0.0)).sum(-1)
        tok = x.argmax(-1) if temperature == 0 else inverse_cdf(p, u)
        return tok, logp.gather(-1, tok[:, None]).squeeze(-1), ent
    if temperature == 0:
        return filter_logits(x, top_k, top_p).argmax(-1), None, None  # (no-op filters at top_k 0, top_p 1)
    if temperature != 1.0:  # the same operations as above on the way to the token, nothing after it
        x = x / temperature
    return inverse_cdf(torch.log_softmax(filter_logits(x, top_k, top_p), dim=-1).exp_(), u), None, None


def sdpa_masks(model) -> bool:
    """Whether the decoder may pass its own 4-D boolean mask (transformers' SDPA attention): transformers then
    skips building one, and with it a host sync per step (`masking_utils._ignore_causal_mask_sdpa`)."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None) == "sdpa"


@torch.no_grad()
def decode(model, ids: torch.Tensor, mask: torch.Tensor, cache, *, temperature: float, top_p: float = 1.0,
           top_k: int = 0, max_new_tokens: int, eos_ids: list[int], pad_id: int, processors=(),
           drop_finished: bool = True, static_cache: bool = True, scores: bool = True,
           uniforms: torch.Tensor | None = None, compact_every: int = 16) -> Sampled:
    """Sample up to `max_new_tokens` tokens after each left-padded prompt of ids / mask [n, w].

    `cache`: the key/value cache of ids[:, :-1] (e.g. a shared prefill), or None to compute it here.
    `compact_every`: end-of-sequence checks and row compaction run after every this many steps, the only
    host syncs of the loop (one copy of the running flags each); between them finished rows are fed the pad token and
    their outputs masked, so the samples do not depend on it.
    `drop_finished=False` keeps finished rows in the batch (fed the pad token), as `generate` does:
    the same samples, for tests and benchmarks.
    `scores=False` (evaluation) computes tokens only (no entropy, no log-prob gathering): the same tokens,
    log-probs and entropies returned as zeros.
    `uniforms` [max_new_tokens, n]: the uniforms of each step (row t = what `draw_uniforms(n)` would draw
    at step t; `streams` draws them for the whole batch and passes each part its columns); None: drawn here.
    """
    n, w = ids.shape
    device = ids.device
    keep1 = {"logits_to_keep": 1} if takes_logits_to_keep(model) else {}
    kw = cache_kw(model)
    if cache is None and w > 1:
        pos = (mask[:, :-1].long().cumsum(-1) - 1).masked_fill(mask[:, :-1] == 0, 1)
        cache = cache_of(model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], position_ids=pos,
                               use_cache=True, **keep1))
    cache = growing_cache(cache, max_new_tokens) if static_cache else (cache or DynamicCache())
    eos = torch.tensor(eos_ids, device=device)
    tokens = torch.full((n, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logps = torch.zeros(n, max_new_tokens, device=device)
    ents = torch.zeros(n, max_new_tokens, device=device)
    seq = torch.cat([ids, torch.full((n, max_new_tokens), pad_id, dtype=torch.long, device=device)], 1)
    att = torch.cat([mask.long(), torch.ones(n, max_new_tokens, dtype=torch.long, device=device)], 1)
    own_mask = sdpa_masks(model)
    if own_mask:
        att = att.bool()[:, None, None, :]  # [n, 1, 1, w + T]: what transformers builds for one query token
    pos = mask.long().sum(-1) - 1  # [n] position of each row's last prompt token
    rows = torch.arange(n, device=device)  # live rows (indices into the batch)
    running = torch.ones(n, dtype=torch.bool, device=device)  # rows not yet finished, among `rows`
    every = max(1, int(compact_every))
    row_steps, steps = 0, 0
    for t in range(max_new_tokens):
        live = rows.numel()
        row_steps += live
        steps = t + 1
        out = model(input_ids=seq[:, w - 1 + t:w + t], attention_mask=att[..., :w + t], position_ids=pos[:, None],
                    use_cache=True, **{kw: cache}, **keep1)
        cache = cache_of(out)
        x = out.logits[:, -1].float()  # [live, V]
        for proc in processors:
            x = proc(seq[:, :w + t], x)
        u = (draw_uniforms(n, device=device) if uniforms is None else uniforms[t])[rows]  # every row's, live or not
        tok, logp, ent = sample_step(x, u, temperature=temperature, top_k=top_k, top_p=top_p, scores=scores)
        tok = torch.where(running, tok, pad_id)
        tokens[rows, t] = tok
        if scores:
            logps[rows, t] = torch.where(running, logp, 0.0)
            ents[rows, t] = torch.where(running, ent, 0.0)
        seq[:, w + t] = tok
        pos = pos + 1
        running = running & ~(tok[:, None] == eos).any(-1)
        if steps % every and steps < max_new_tokens:
            continue  # no host sync between compactions
        flags = running.tolist()  # the one host sync of a compaction: one copy of `live` flags
        alive = sum(flags)
        if not alive:
            break
        if not drop_finished or alive == live:
            continue
        keep, holes, fills = survivor_plan(flags)
        keep = torch.tensor(keep, dtype=torch.long, device=device)
        rows, seq, att, pos, running = rows[keep], seq[keep], att[keep], pos[keep], running[keep]
        compact_cache(cache, keep, torch.tensor(holes, dtype=torch.long, device=device),
                      torch.tensor(fills, dtype=torch.long, device=device))
    return Sampled(tokens[:, :steps], logps[:, :steps], ents[:, :steps], row_steps)
