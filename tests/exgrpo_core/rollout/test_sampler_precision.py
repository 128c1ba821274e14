"""The inverse-CDF sampler on a Qwen2.5-wide vocabulary (151,936 tokens) with a tail of tokens at 1e-8 to
1e-7: with float64 uniforms and a float64 CDF every tail token gets its own share of the uniforms. In
float32 (the old sampler) the CDF past a mass of 0.5 moves in steps of 6e-8: a 1e-8 token's interval is
empty or 6x too wide, a 1e-7 token's 1 or 2 steps; a float32 scan (CUDA) also drops the increments."""

import torch

from exgrpo_core.rollout.decode import draw_uniforms, inverse_cdf

V = 151_936
BANDS = ((1e-8, 40_000), (3e-8, 40_000), (1e-7, 40_000))  # (mass per token, tokens), at the vocabulary's end


def _law() -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """float32 probabilities [V]: a random head first (mass ~0.994), then the tail bands; band index ranges."""
    tail = sum(m * k for m, k in BANDS)
    head = V - sum(k for _, k in BANDS)
    probs = torch.empty(V, dtype=torch.float32)
    probs[:head] = torch.softmax(torch.randn(head, generator=torch.Generator().manual_seed(0)), 0) * (1 - tail)
    ranges, lo = [], head
    for m, k in BANDS:
        probs[lo:lo + k] = m
        ranges.append((lo, lo + k))
        lo += k
    return probs, ranges


def _draw(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    return inverse_cdf(probs[None], u)  # one distribution, many uniforms (rows: test_decode.py)


def test_tail_bands_are_drawn_at_their_rates():
    """A million seeded draws; Pearson's chi-square over head and the three bands within 5 standard
    deviations (3 dof), each band within 15% of its rate. Expected per band: 400, 1,200, 4,000 draws; the
    float32 CDF draws none of the first and twice the second."""
    probs, ranges = _law()
    n = 1_000_000
    u = torch.rand(n, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    tok = _draw(probs, u)
    counts = [int(((tok >= lo) & (tok < hi)).sum()) for lo, hi in ranges]
    counts = [n - sum(counts)] + counts
    law = probs.double()
    expected = [float(law[:ranges[0][0]].sum()) * n] + [float(law[lo:hi].sum()) * n for lo, hi in ranges]
    stat = sum((c - e) ** 2 / e for c, e in zip(counts, expected))
    assert stat < 3 + 5 * 6 ** 0.5, (counts, expected, stat)
    for c, e in zip(counts[1:], expected[1:]):
        assert abs(c - e) < 0.15 * e, (counts, expected)


def test_every_tail_token_owns_its_interval():
    """A uniform at the middle of a tail token's exact interval draws that token: 300 tokens of each band
    (a float32 CDF gives the 1e-8 tokens an empty interval, so they are never drawn)."""
    probs, ranges = _law()
    cdf = probs.double().cumsum(0)  # float64: rounding ~1e-16, nothing next to a 1e-8 interval
    total = float(cdf[-1])
    picks = torch.cat([torch.linspace(lo, hi - 1, 300).long() for lo, hi in ranges])
    u = (cdf[picks] - probs.double()[picks] / 2) / total
    assert torch.equal(_draw(probs, u), picks)


def test_uniforms_have_53_bits():
    """float32 uniforms are multiples of 2^-24: a token of mass under 6e-8 falls between them."""
    torch.manual_seed(0)
    u = draw_uniforms(1000)
    assert u.dtype == torch.float64 and float(u.min()) >= 0 and float(u.max()) < 1
    assert ((u * 2 ** 24) != (u * 2 ** 24).floor()).float().mean() > 0.99


def test_a_uniform_grid_over_the_tail_hits_each_token_in_proportion():
    """2^22 evenly spread uniforms over the tail's part of [0, 1): every tail token gets N * p / tail
    of them up to +-1 (7.5 for a 1e-8 token, 75 for 1e-7; the old float32 sampler gives 0 or ~45 and
    0 / 45 / 90)."""
    probs, ranges = _law()
    law = probs.double()
    total = float(law.sum())
    start = float(law[:ranges[0][0]].sum()) / total  # where the tail begins in u
    n = 2 ** 22
    u = start + (1 - start) * (torch.arange(n, dtype=torch.float64) + 0.5) / n
    counts = torch.bincount(_draw(probs, u), minlength=V).double()
    lo = ranges[0][0]
    want = n * law[lo:] / law[lo:].sum()
    assert counts[:lo].sum() <= 1  # (the grid's first point may fall on the head's last token)
    assert (counts[lo:] - want).abs().max() <= 1.0 + 1e-6
