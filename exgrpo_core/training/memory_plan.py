"""Per-GPU memory plan of a run, phase by phase: weights, gradients, optimiser state, activations, logits, vLLM.

Closed-form estimates from the model shape and the config, to size a cluster before renting it
(docs/scaling.md prints the plan of `configs/paper.yaml`). FSDP full sharding over `world` GPUs with
fp32 master weights, fp32 gradients and two fp32 AdamW moments; bf16 compute; activations under
gradient checkpointing keep one hidden state per layer plus one layer being recomputed; the
model returns bf16 logits for the whole micro-batch (policy.py), and the fp32 log-prob / entropy
maths runs in chunks of `logits_chunk` positions.

The optimiser step's micro-batches are padded or packed (`train.pack_sequences`, packing.py). Both hold
at most `micro_batch_tokens` positions: padded ones count their padding in it and, when rows differ in
length, carry a boolean attention mask [rows, 1, l, l] (l <= `row_tokens`); packed ones hold only real
tokens, and no mask. Prompt sharing (`shared_prompt_tokens`, padded only) keeps the distinct prompts'
activations across a group's micro-batches and gives each row a copy of its prompt's K/V cache; it is off
under gradient checkpointing and FSDP2, so the caller passes 0 there. Scoring is always padded (its mask
is not counted).
"""

from __future__ import annotations

from dataclasses import dataclass

GiB = 1024 ** 3


@dataclass(frozen=True)
class ModelShape:
    """What the plan needs from a decoder-only transformer's config."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    tied_embeddings: bool = False
    qkv_bias: bool = True

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def params(self) -> int:
        """Parameter count: attention (q, o full; k, v grouped, with q/k/v biases), SwiGLU MLP, norms, embeddings."""
        kv = self.kv_heads * self.head_dim
        attn = 2 * self.hidden * self.hidden + 2 * self.hidden * kv
        attn += (self.hidden + 2 * kv) if self.qkv_bias else 0
        mlp = 3 * self.hidden * self.intermediate
        per_layer = attn + mlp + 2 * self.hidden
        emb = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return self.layers * per_layer + emb + self.hidden

    @classmethod
    def from_hf_config(cls, c) -> "ModelShape":
        return cls(layers=c.num_hidden_layers, hidden=c.hidden_size, intermediate=c.intermediate_size,
                   heads=c.num_attention_heads, kv_heads=getattr(c, "num_key_value_heads", c.num_attention_heads),
                   vocab=c.vocab_size, tied_embeddings=bool(getattr(c, "tie_word_embeddings", False)),
                   qkv_bias=bool(getattr(c, "attention_bias", c.model_type == "qwen2")))


# Qwen2.5-Math-7B (config.json of the Hugging Face checkpoint).
QWEN25_MATH_7B = ModelShape(layers=28, hidden=3584, intermediate=18944, heads=28, kv_heads=4, vocab=152064)


@dataclass(frozen=True)
class Plan:
    phases: dict[str, dict[str, float]]  # phase -> name -> GiB per GPU
    notes: dict[str, str]

    @property
    def rows(self) -> dict[str, float]:
        """The optimiser step's rows (the phase that holds gradients and activations)."""
        return self.phases["optimiser step"]

    @property
    def total(self) -> float:
        """The peak over the phases."""
        return max(sum(rows.values()) for rows in self.phases.values())


def kv_bytes_per_token(m: ModelShape, tp: int, dtype_bytes: int = 2) -> float:
    """K and V for every layer, split over `tp` tensor-parallel ranks."""
    return 2 * m.layers * m.kv_heads * m.head_dim * dtype_bytes / tp


def memory_plan(m: ModelShape, *, world: int, micro_batch_tokens: int, logits_chunk: int = 4096,
                vllm_tp: int = 2, vllm_gpu_share: float = 0.35, gpu_gib: float = 80.0,
                prefetch_layers: int = 2, vllm_sleep: bool = False,
                unsharded_grad_accumulation: bool = False, packed: bool = False, row_tokens: int = 0,
                shared_prompt_tokens: int = 0) -> Plan:
    """Per-GPU GiB in each phase of a step: sampling (the colocated vLLM engine awake), scoring (the
    trainer's no-grad forward) and the optimiser step. The trainer's sharded weights and AdamW moments
    stay all along; gradients exist only in the optimiser step (freed after it); the engine's weights
    and KV cache are released during scoring and training with `vllm_sleep` (level 2).
    `unsharded_grad_accumulation`: FSDP2 with gradient sync off between micro-batches keeps every
    parameter's whole float32 gradient on every GPU until the last micro-batch.
    `packed`: the optimiser step's micro-batches are packed (no mask, no shared prompts); else padded with
    rows of up to `row_tokens` tokens (0: the mask is not counted) and `shared_prompt_tokens` prompt tokens
    run once per group (module docstring)."""
    p = m.params
    layer_params = (p - m.vocab * m.hidden * (1 if m.tied_embeddings else 2)) / m.layers
    state = {"weights fp32 (sharded)": 4 * p / world / GiB, "AdamW moments fp32 (sharded)": 8 * p / world / GiB}
    gathered = {"gathered bf16 layers (FSDP prefetch)": 2 * (prefetch_layers * layer_params + m.vocab * m.hidden) / GiB}
    vllm_weights = 2 * p / vllm_tp / GiB
    engine = {"vLLM weights bf16 (TP shard)": vllm_weights,
              "vLLM KV cache": max(vllm_gpu_share * gpu_gib - vllm_weights, 0.0)}
    asleep = {} if vllm_sleep else engine
    scoring = {**state, **gathered,
               "one layer's activations bf16": 2 * micro_batch_tokens * (3 * m.intermediate + 4 * m.hidden) / GiB,
               "model logits bf16": 2 * micro_batch_tokens * m.vocab / GiB,
               "log-prob/entropy chunk fp32": 4 * min(logits_chunk, micro_batch_tokens) * m.vocab / GiB, **asleep}
    train = {**state, "gradients fp32 (sharded)": 4 * p / world / GiB}
    if unsharded_grad_accumulation:
        train["gradients fp32 (whole, accumulated unsharded)"] = 4 * p / GiB
    train.update({**gathered,
                  "checkpointed hidden states bf16": 2 * micro_batch_tokens * m.hidden * m.layers / GiB,
                  "one layer recomputed (MLP dominates)": 2 * micro_batch_tokens * (3 * m.intermediate + 4 * m.hidden) / GiB,
                  "model logits bf16 + their grad": 2 * 2 * micro_batch_tokens * m.vocab / GiB,
                  "log-prob/entropy chunk fp32 (+grad)": 2 * 4 * min(logits_chunk, micro_batch_tokens) * m.vocab / GiB})
    if not packed:
        train.update(padded_rows(m, micro_batch_tokens, row_tokens, shared_prompt_tokens))
    train.update(asleep)
    phases = {"sampling": {**state, **engine}, "scoring": scoring, "optimiser step": train}
    kv_tokens = engine["vLLM KV cache"] * GiB / kv_bytes_per_token(m, vllm_tp)
    peak = max(sum(r.values()) for r in phases.values())
    notes = {"params": f"{p / 1e9:.2f} B", "kv_tokens_per_engine": f"{kv_tokens:,.0f}",
             "kv_bytes_per_token_per_gpu": f"{kv_bytes_per_token(m, vllm_tp):,.0f}",
             "headroom_gib": f"{gpu_gib - peak:.1f}",
             "optimiser_micro_batches": (f"packed: at most {micro_batch_tokens:,} real tokens, no padding" if packed
                                         else f"padded: at most {micro_batch_tokens:,} tokens with padding")}
    return Plan(phases, notes)


def padded_rows(m: ModelShape, micro_batch_tokens: int, row_tokens: int, shared_prompt_tokens: int) -> dict[str, float]:
    """What a padded micro-batch holds beyond a packed one of as many tokens, GiB: its attention mask, rows x
    l x l with rows x l <= micro_batch_tokens, as booleans (policy._host_mask) plus the bf16 copy SDPA
    makes of it for the layer being recomputed; with prompt sharing the shared prompts' activations (kept
    for the backward, 16h + 6i bytes per token and layer as in layout.activation_bytes) and the rows'
    copies of their prompts' K/V cache (at most as many tokens, and at most the micro-batch's)."""
    rows = {}
    if row_tokens:
        rows["attention mask (bool + one layer's bf16)"] = (
            3 * micro_batch_tokens * min(row_tokens, micro_batch_tokens) / GiB)
    if shared_prompt_tokens:
        rows["shared prompts' activations bf16"] = (
            shared_prompt_tokens * m.layers * (16 * m.hidden + 6 * m.intermediate) / GiB)
        rows["shared prompts' K/V copies bf16"] = (
            min(shared_prompt_tokens, micro_batch_tokens) * kv_bytes_per_token(m, tp=1) / GiB)
    return rows


def render(plan: Plan) -> str:
    """Markdown table of a plan: one column per phase, a dash where a row is not held."""
    names = list(dict.fromkeys(k for rows in plan.phases.values() for k in rows))
    lines = ["| per GPU, GiB | " + " | ".join(plan.phases) + " |", "|---|" + "---:|" * len(plan.phases)]
    lines += [f"| {n} | " + " | ".join(f"{rows[n]:.1f}" if n in rows else "-" for rows in plan.phases.values())
              + " |" for n in names]
    lines.append("| **total** | " + " | ".join(f"**{sum(r.values()):.1f}**" for r in plan.phases.values()) + " |")
    return "\n".join(lines)
