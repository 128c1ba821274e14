"""Rollout engines: sample K responses per prompt and return `Generation` records (docs/implementation_details.md).

The transformers engine batches `generate` over left-padded prompts and reads the sampler's own
log-probs and entropies from the processed scores (after temperature / top-p). It samples with the
configured temperature / top-p / top-k and nothing else: the model's own `generation_config`
(repetition penalty, n-gram bans, ... as shipped with some instruct models) is not applied, so the
samples are the policy's. Extra `logits_processors` are the caller's explicit choice (the loop then
rescores). These are the *sampler's* numbers; the trainer's behaviour log-probs and H(o) come from
`policy.py` (docs/implementation_details.md).
The vLLM engine arrives with the scale-out issue behind the same `generate` signature.
"""

from __future__ import annotations

import itertools
import threading
from typing import Protocol

import torch
from transformers import GenerationConfig, LogitsProcessorList

from exgrpo_core.rollout.decode import Sampled, decode, draw_uniforms, prefix_prefill
from exgrpo_core.rollout.packed import packed_linears
from exgrpo_core.rollout.static_decode import InferenceCopy, StaticDecoder
from exgrpo_core.training import fsdp
from exgrpo_core.training.forward_parts import cache_kw, copied_prompt_cache
from exgrpo_core.types import Generation


class RolloutEngine(Protocol):
    tunable: frozenset[str]
    """The settings a caller may replace for one `generate` call (evaluation's top_p, batch size);
    `Worker.generate` applies those the engine lists and leaves the rest to the engine."""

    def generate(self, prompts: list[list[int]], n: int | list[int], *, temperature: float,
                 max_new_tokens: int) -> list[list[Generation]]:
        """Sample `n` responses for every prompt (or n[i] for prompts[i]); result[i] holds prompts[i]'s."""


def sample_counts(prompts: list, n: int | list[int]) -> list[int]:
    """Responses wanted per prompt: `n` for each, or the list itself (checked against the prompts)."""
    if isinstance(n, int):
        counts = [n] * len(prompts)
    else:
        counts = [int(c) for c in n]
        if len(counts) != len(prompts):
            raise ValueError(f"{len(counts)} sample counts for {len(prompts)} prompts")
    if any(c < 1 for c in counts):
        raise ValueError(f"every prompt needs at least one sample, got counts {counts}")
    return counts


class TransformersEngine:
    """Batched sampling with `model.generate` (CPU or one GPU)."""

    tunable = frozenset({"top_p", "batch_size", "scores"})

    def __init__(self, model, tokenizer, *, top_p: float = 1.0, batch_size: int = 64,
                 logits_processors: list | None = None):
        self.model = model
        self.logits_processors = list(logits_processors or [])
        """Processors (transformers `LogitsProcessor`s) applied after temperature / top-p: the samples
        are then not the policy's, so `loop.needs_rescore` has the trainer score them."""
        self.tokenizer = tokenizer
        self.top_p = top_p
        self.batch_size = batch_size
        self.eos_ids = eos_token_ids(
            getattr(getattr(model, "generation_config", None), "eos_token_id", None), tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        self.synced = False  # FSDP2: keep stepping until every process is done (forwards are collectives)
        self.share_prefill = True  # shared prompt tokens run once (own: `decode.prefix_prefill`; generate:
        # `_shared_prefill`, repeated prompts only)
        self.min_prefix = 2  # (own) shortest common prefix worth a prefill of its own
        self.decoder = "auto"  # "eager" (or "own"): `decode.decode`, finished rows dropped; "static":
        # `static_decode` on a bf16 inference copy at fixed shapes; "generate": transformers' loop; "auto":
        # static on CUDA without logits processors, else eager (`rollout.decoder`)
        self.inference = InferenceCopy()  # (static) the copy, refreshed at a `generate` call after the weights changed
        self.static = StaticDecoder()  # (static) caches and compiled steps per batch shape
        self.inference_dtype = None  # the dtype the last `generate` sampled in when not the model's (static)
        self.drop_finished = True  # (own) finished rows leave the batch
        self.static_cache = True  # (own) the key/value cache is written in place
        self.scores = True  # (own) compute log-probs and entropies; False: tokens only (evaluation)
        self.streams = 1  # (own, CPU) a batch is decoded in this many parts, each in its own thread;
        # 0: auto, min(2, torch threads) (`rollout.decode_streams`)
        self.min_stream_rows = 8  # (own) rows each part needs, or fewer parts
        self.matmul = "auto"  # (own) "auto": linear layers on oneDNN with packed weights on a float32 CPU
        # (rollout/packed.py); "torch": torch's own product (`rollout.decode_matmul`)
        self.packed_layers = 0  # layers the last `generate` call multiplied on packed weights
        self.row_steps = 0  # decode row-steps computed so far (rows in a forward, summed over steps)
        self.compact_every = 16  # (eager, static) end-of-sequence checks (and compaction) every this many steps
        # (`rollout.decode_compact_every`): the decode loop's only host syncs

    def sampling_path(self, device: torch.device) -> str:
        """The decoder `generate` uses on `device`: "eager", "static" or "generate"."""
        path = {"own": "eager"}.get(self.decoder, self.decoder)
        if path == "auto":
            path = "static" if device.type == "cuda" and not self.logits_processors else "eager"
        if path not in ("eager", "static", "generate"):
            raise ValueError(f"unknown decoder {self.decoder!r}: use auto, eager, static or generate")
        if path == "static" and self.logits_processors:
            raise ValueError("the static decoder takes no logits processors: use rollout.decoder=eager")
        return path

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], n: int | list[int], *, temperature: float,
                 max_new_tokens: int) -> list[list[Generation]]:
        counts = sample_counts(prompts, n)
        flat = [p for p, c in zip(prompts, counts) for _ in range(c)]  # one batch for all counts
        out: list[Generation] = []
        device = fsdp.compute_device(self.model)
        path = self.sampling_path(device)
        self.inference_dtype = self.inference.dtype if path == "static" else None
        copy = self.inference.refresh(self.model, device) if path == "static" else None  # copies after a step only
        was_training = self.model.training
        self.model.eval()
        try:
            with packed_linears(self.model, self.matmul == "auto" and path == "eager"
                                and not self.synced) as self.packed_layers:
                for i in range(0, len(flat), self.batch_size):
                    out.extend(self._generate_chunk(flat[i:i + self.batch_size], temperature, max_new_tokens,
                                                    path, copy))
        finally:
            self.model.train(was_training)
        ends = list(itertools.accumulate(counts))
        return [out[e - c:e] for c, e in zip(counts, ends)]

    def _generate_chunk(self, prompts: list[list[int]], temperature: float, max_new_tokens: int,
                        path: str = "eager", copy=None) -> list[Generation]:
        device = fsdp.compute_device(self.model)
        if path == "static":  # every process decodes on its own copy: no collective per step
            ids, mask = left_padded(prompts, self.pad_id, device)
            res = self.static.decode(copy, ids, mask, temperature=temperature, top_p=self.top_p,
                                     max_new_tokens=max_new_tokens, eos_ids=self.eos_ids, pad_id=self.pad_id,
                                     scores=self.scores, check_every=self.compact_every,
                                     rows=self.batch_size if device.type == "cuda" else None)  # one shape per size
            self.row_steps += res.row_steps
            seqs, token_logp, ent = res.tokens.cpu(), res.logprobs.cpu(), res.entropies.cpu()
        elif path == "eager" and not self.synced:  # synced (FSDP2): every process must run each forward
            streams = self.streams or min(2, torch.get_num_threads())  # 0: auto
            parts = stream_parts(len(prompts), streams, self.min_stream_rows)
            if len(parts) > 1 and device.type == "cpu" and not self.logits_processors:
                res = self._decode_streams(prompts, parts, temperature, max_new_tokens)
            else:
                res = self._decode(prompts, device, temperature, max_new_tokens)
            self.row_steps += res.row_steps
            seqs, token_logp, ent = res.tokens.cpu(), res.logprobs.cpu(), res.entropies.cpu()
        else:
            ids, mask = left_padded(prompts, self.pad_id, device)
            seqs, token_logp, ent = self._hf_generate(ids, mask, ids.shape[1], temperature, max_new_tokens)
        rows = zip(seqs.tolist(), token_logp.tolist(), ent.tolist())  # three copies for the batch, not 3 per row
        return [self._record(*row, max_new_tokens) for row in rows]

    def _decode(self, prompts: list[list[int]], device, temperature: float, max_new_tokens: int,
                uniforms: torch.Tensor | None = None) -> Sampled:
        """`decode.decode` over `prompts` (their shared tokens prefilled once when `share_prefill`)."""
        shared = prefix_prefill(self.model, prompts, self.pad_id, self.min_prefix) if self.share_prefill else None
        ids, mask, cache = shared if shared is not None else (*left_padded(prompts, self.pad_id, device), None)
        return decode(self.model, ids, mask, cache, temperature=temperature, top_p=self.top_p,
                      max_new_tokens=max_new_tokens, eos_ids=self.eos_ids, pad_id=self.pad_id,
                      processors=self.logits_processors, drop_finished=self.drop_finished,
                      static_cache=self.static_cache, scores=self.scores, uniforms=uniforms,
                      compact_every=self.compact_every)

    def _decode_streams(self, prompts: list[list[int]], parts: list[tuple[int, int]], temperature: float,
                        max_new_tokens: int) -> Sampled:
        """Decode rows [lo, hi) of each part in its own Python thread, torch single-threaded there (ops
        release the GIL), the caller's torch threads shared among them: small decode GEMMs scale badly over
        torch's intra-op threads (and every op waits for all of them on a shared machine). Every step's
        uniforms are drawn for the whole batch first, each part gets its columns, and the random stream
        is left where one batch would leave it (steps x n draws): the same samples as one stream."""
        n, per_part = len(prompts), max(1, torch.get_num_threads() // len(parts))
        state = torch.get_rng_state()
        uniforms = draw_uniforms(max_new_tokens, n)  # row t = the draw_uniforms(n) of step t (tested)
        out: list[Sampled | BaseException | None] = [None] * len(parts)

        def work(i: int, lo: int, hi: int) -> None:
            try:
                torch.set_num_threads(per_part)  # this thread's setting only (OpenMP / MKL keep it per thread)
                with torch.no_grad():
                    out[i] = self._decode(prompts[lo:hi], torch.device("cpu"), temperature, max_new_tokens,
                                          uniforms[:, lo:hi])
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller
                out[i] = e

        workers = [threading.Thread(target=work, args=(i, lo, hi), name=f"decode-{i}")
                   for i, (lo, hi) in enumerate(parts)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        for r in out:
            if isinstance(r, BaseException):
                raise r
        steps = max(r.tokens.shape[1] for r in out)
        torch.set_rng_state(state)
        draw_uniforms(steps * n)  # advance the stream as one batch of `steps` steps would have
        pad = lambda x, v: torch.nn.functional.pad(x, (0, steps - x.shape[1]), value=v)  # noqa: E731
        return Sampled(torch.cat([pad(r.tokens, self.pad_id) for r in out]),
                       torch.cat([pad(r.logprobs, 0.0) for r in out]),
                       torch.cat([pad(r.entropies, 0.0) for r in out]), sum(r.row_steps for r in out))

    def _hf_generate(self, ids, mask, width: int, temperature: float, max_new_tokens: int):
        """transformers' `generate` with the engine's settings only: [n, T] tokens, log-probs, entropies."""
        config = GenerationConfig(**_sampling(temperature, self.top_p), max_new_tokens=max_new_tokens,
                                  pad_token_id=self.pad_id, eos_token_id=self.eos_ids, output_scores=True, return_dict_in_generate=True)
        own, self.model.generation_config = self.model.generation_config, GenerationConfig()  # generate() fills
        try:  # unset fields from the model's config (repetition_penalty, ...): give it an empty one meanwhile
            res = self.model.generate(
                input_ids=ids, attention_mask=mask, **{cache_kw(self.model): self._shared_prefill(ids, mask)},
                generation_config=config, synced_gpus=self.synced,
                logits_processor=LogitsProcessorList(self.logits_processors))
        finally:
            self.model.generation_config = own
        seqs = res.sequences[:, width:].cpu()  # [n, T]
        self.row_steps += seqs.shape[0] * seqs.shape[1]
        token_logp = torch.zeros(seqs.shape)  # [n, T]
        ent = torch.zeros(seqs.shape)  # [n, T]
        for t, step_scores in enumerate(res.scores):  # one [n, V] at a time: never [n, T, V] in memory
            logp = torch.log_softmax(step_scores.float(), dim=-1).cpu()
            token_logp[:, t] = logp.gather(-1, seqs[:, t:t + 1]).squeeze(-1)
            ent[:, t] = -(logp.exp() * logp.nan_to_num(neginf=0.0)).sum(-1)
        return seqs, token_logp, ent

    def _shared_prefill(self, ids: torch.Tensor, mask: torch.Tensor):
        """The key/value cache of every row's prompt but its last token, computed once per distinct
        prompt and copied to its repeats (K samples of a question share one prompt): `generate` then
        starts at the last prompt token. None (plain `generate`) when no prompt repeats or the model
        keeps no cache.
        """
        if not self.share_prefill or self.synced or ids.shape[1] < 2:  # synced: forwards are collectives,
            return None  # and another process's chunk may have no repeats
        w = ids.shape[1]
        uniq, rows = torch.unique(torch.cat([ids, mask], 1), dim=0, return_inverse=True)  # rows [n] -> distinct
        if uniq.shape[0] == ids.shape[0]:
            return None
        u_ids, m = uniq[:, :w - 1], uniq[:, w:2 * w - 1]  # [u, w-1]: all but the last column
        position_ids = (m.long().cumsum(-1) - 1).masked_fill(m == 0, 1)  # as generate numbers the prompt
        return copied_prompt_cache(self.model, u_ids, m, position_ids, rows)

    def _record(self, ids: list[int], logp: list[float], ent: list[float], max_new_tokens: int) -> Generation:
        length = len(ids)
        for t, tok in enumerate(ids):
            if tok in self.eos_ids:
                length = t + 1  # keep the EOS: the policy is trained to stop
                break
        truncated = length == len(ids) and (length == 0 or ids[length - 1] not in self.eos_ids)
        truncated = truncated and len(ids) >= max_new_tokens
        ids = ids[:length]
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        if not self.scores:  # tokens only: no numbers to return
            return Generation(response_ids=ids, logprobs=[], text=text, truncated=truncated, entropies=[])
        return Generation(response_ids=ids, logprobs=logp[:length], text=text,
                          truncated=truncated, entropies=ent[:length])


def left_padded(prompts: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """ids and attention mask [n, longest prompt], prompts at the right edge (generation continues there)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[row, width - len(p):] = 1
    return ids.to(device), mask.to(device)


def stream_parts(n: int, streams: int, min_rows: int) -> list[tuple[int, int]]:
    """Row ranges [lo, hi) of `n` rows cut into up to `streams` near-equal parts of at least `min_rows` each."""
    k = max(1, min(streams, n // max(min_rows, 1)))
    cuts = [round(i * n / k) for i in range(k + 1)]
    return list(zip(cuts[:-1], cuts[1:]))


def _sampling(temperature: float, top_p: float) -> dict:
    """`generate` arguments: sampling at `temperature`, or greedy decoding when it is 0 (evaluation only)."""
    if temperature > 0:
        return {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0}
    return {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}


def weight_chunks(named, max_bytes: int, prepare=lambda t: t):
    """Group a stream of (name, tensor) into lists of at most `max_bytes` (a larger tensor goes
    alone), each tensor passed through `prepare` first (e.g. to the receiver's dtype)."""
    chunk, size = [], 0
    for name, p in named:
        t = prepare(p.detach())
        if chunk and size + t.numel() * t.element_size() > max_bytes:
            yield chunk
            chunk, size = [], 0
        chunk.append((name, t))
        size += t.numel() * t.element_size()
    if chunk:
        yield chunk


def eos_token_ids(generation_eos, tokenizer) -> list[int]:
    """All ids that end a response: the model's generation-config EOS (an id or a list) plus the tokenizer's."""
    ids: list[int] = []
    for x in (generation_eos if isinstance(generation_eos, list) else [generation_eos]) + [tokenizer.eos_token_id]:
        if x is not None and x not in ids:
            ids.append(int(x))
    if not ids:
        raise ValueError("tokenizer has no eos_token_id; the rollout engine cannot detect the end of a response")
    return ids
