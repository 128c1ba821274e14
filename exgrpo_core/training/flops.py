"""Model FLOPs of a training step, for model FLOP utilisation (MFU).

Convention of PaLM (Chowdhery et al. 2022, appendix B): a forward and backward pass costs 6 FLOPs
per matrix-multiply parameter per token, plus 12 * layers * d_attn * T per token for attention over
a sequence of T tokens. Recomputation (gradient checkpointing) is not counted, and neither is the
work that prompt sharing (`train.share_prompt_forward`) saves: every row counts its whole sequence.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn


def matmul_params(model: nn.Module) -> int:
    """Parameters used in matrix multiplies: every Linear weight, the output head included (an input
    embedding is a lookup). FSDP2 shards count whole (DTensor numel is global)."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))


def train_flops(n_matmul: int, layers: int, d_attn: int, seq_lens: Sequence[int]) -> float:
    """Forward + backward FLOPs over sequences of `seq_lens` tokens: sum_T T * (6N + 12 L d T) (PaLM App. B)."""
    return float(sum(t * (6 * n_matmul + 12 * layers * d_attn * t) for t in seq_lens))


def model_train_flops(model: nn.Module, seq_lens: Sequence[int]) -> float:
    """`train_flops` of a Hugging Face decoder (layers and attention width from its config)."""
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    d_attn = c.num_attention_heads * head_dim
    return train_flops(matmul_params(model), c.num_hidden_layers, d_attn, seq_lens)
