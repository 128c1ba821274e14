"""FLOP accounting for the speed benchmarks: this machine's measured matmul rate (the floor's
denominator) and executed vs useful model FLOPs of sampling and of a training step.

Counts are matrix-multiply parameter FLOPs (2 per parameter per token forward, 6 forward + backward,
the output head included where it runs); attention over the context adds ~3% at cpu-demo's lengths
(~110 tokens, SmolLM2-135M) and is left out of both counts alike.
"""

from __future__ import annotations

import time

import torch
from torch import nn


def matmul_rate(threads: int | None = None, n: int = 2048, repeats: int = 5, wall: bool = False) -> float:
    """FLOP per CPU-second of an n x n fp32 matmul on `threads` threads (best of `repeats`; CPU time,
    so other jobs on a shared machine slow the wall clock, not this rate). `wall`: FLOP per wall
    second instead (what `threads` cores give together: the floor of a multi-threaded run)."""
    saved = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        a, b = torch.randn(n, n), torch.randn(n, n)
        torch.mm(a, b)
        best = float("inf")
        for _ in range(repeats):
            clock = time.perf_counter if wall else time.process_time
            t0 = clock()
            torch.mm(a, b)
            best = min(best, clock() - t0)
        return 2 * n ** 3 / best
    finally:
        torch.set_num_threads(saved)


def head_and_body(model: nn.Module) -> tuple[int, int]:
    """(output-head parameters, other matmul parameters) of a causal LM."""
    head = model.get_output_embeddings().weight.numel()
    total = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    return head, total - head


def decode_flops(model: nn.Module, prompts: list[list[int]], k: int, lengths: list[int],
                 row_steps: int) -> tuple[float, float]:
    """(executed, useful) FLOPs of sampling k responses per prompt with a shared prefill.

    Useful: each distinct prompt's tokens but the last once through the body, and every response
    token (the step that feeds a token also produces the next) through body and head. Executed: the
    prefill over the padded width, and `row_steps` rows through body and head.
    """
    head, body = head_and_body(model)
    distinct = {tuple(p) for p in prompts}
    width = max(len(p) for p in prompts)
    useful = sum(2 * body * (len(p) - 1) for p in distinct) + 2 * (body + head) * sum(lengths)
    executed = 2 * body * (width - 1) * len(distinct) + 2 * (body + head) * row_steps
    return float(executed), float(useful)


def step_useful_flops(model: nn.Module, prompt_tokens: int, generated: int, trained: int) -> float:
    """Useful FLOPs of one RL step: sampling runs each distinct prompt once through the body
    (`prompt_tokens`) and each generated token through body and head; the training pass (forward +
    backward: 3x) runs each distinct prompt once and each trained response token (`trained`:
    generated + replayed) through body and head. Scoring passes (selection, rescoring) and padding
    are executed work beyond this."""
    head, body = head_and_body(model)
    sample = 2 * (body * prompt_tokens + (body + head) * generated)
    train = 6 * (body * prompt_tokens + (body + head) * trained)
    return float(sample + train)


class Counted:
    """Executed FLOPs of a block (torch's FlopCounterMode: matmuls and attention, forward and
    backward); `flops` is None when the block was not counted."""

    def __init__(self, on: bool):
        self.on, self.flops, self._mode = on, None, None

    def __enter__(self):
        if self.on:
            from torch.utils.flop_counter import FlopCounterMode

            self._mode = FlopCounterMode(display=False)
            self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        if self._mode is not None:
            self._mode.__exit__(*exc)
            self.flops = float(self._mode.get_total_flops())
        return False
