"""Decode's linear layers on oneDNN with weights packed once (CPU, float32; `rollout.decode_matmul`).

A decode step multiplies a few rows (the live samples) by every weight matrix of the model. At 4-32
rows torch's default CPU product (MKL sgemm on a [out, in] weight) reads each weight well below the
memory bandwidth; oneDNN's inner product on a weight reordered once into its own blocked layout
reads it 1.3-1.6x faster (docs/benchmarks/speed.md). The product is the same; only the float
rounding of its sums differs (~1e-6 relative), so tokens stay the same except where a uniform falls
within that distance of a boundary of the sampling CDF.

Weights are packed anew on entering `packed_linears` (once per `generate` call of the engine) and
dropped on leaving: a weight's version cannot tell whether it changed (the fused AdamW step writes
the parameters without bumping it), and packing costs a few percent of a decode.
"""

from __future__ import annotations

import contextlib

import torch


def available(model: torch.nn.Module) -> bool:
    """Whether `packed_linears` applies: parameters on the CPU in float32 and torch built with oneDNN."""
    p = next(model.parameters(), None)
    return (p is not None and p.device.type == "cpu" and p.dtype == torch.float32
            and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def packed_weight(mod: torch.nn.Linear) -> torch.Tensor:
    """A copy of `mod.weight` in oneDNN's blocked layout."""
    return torch.ops.mkldnn._reorder_linear_weight(mod.weight.detach(), None)


def _forward(mod: torch.nn.Linear, packed: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    flat = x.reshape(-1, x.shape[-1])
    y = torch.ops.mkldnn._linear_pointwise(flat, packed, mod.bias, "none", [], "")
    return y.view(*x.shape[:-1], y.shape[-1])


@contextlib.contextmanager
def packed_linears(model: torch.nn.Module, enabled: bool = True):
    """Within the block, every float32 CPU `nn.Linear` of `model` multiplies by a copy of its weight
    packed on entry (no autograd: decoding only; the weights must not change inside the block). Yields
    the number of layers switched; 0 when `enabled` is False or `available(model)` is not."""
    patched: list[torch.nn.Module] = []
    if enabled and not torch.is_grad_enabled() and available(model):
        for mod in model.modules():
            w = mod.weight if type(mod) is torch.nn.Linear else None
            if (w is not None and "forward" not in vars(mod) and w.dtype == torch.float32 and w.device.type == "cpu"
                    and type(w.detach()) is torch.Tensor):  # not a sharded (FSDP2 DTensor) weight
                packed = packed_weight(mod)
                mod.forward = lambda x, mod=mod, packed=packed: _forward(mod, packed, x)
                patched.append(mod)
    try:
        yield len(patched)
    finally:
        for mod in patched:
            del mod.forward
