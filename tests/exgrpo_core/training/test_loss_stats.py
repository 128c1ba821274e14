"""Loss statistics as tensors (issue 32 item 3): the same values as the float statistics, computed
without reading anything back to the host."""

from functools import partial

import pytest
import torch

from exgrpo_core.algorithm import losses
from exgrpo_core.observe.host_syncs import counting


def _inputs(replay_rows):
    g = torch.Generator().manual_seed(0)
    n, t = 4, 6
    logp = -torch.rand(n, t, generator=g) * 3
    old = logp + 0.3 * torch.randn(n, t, generator=g)
    mask = torch.ones(n, t, dtype=torch.bool)
    mask[1, 4:] = False
    is_replay = torch.tensor([i in replay_rows for i in range(n)])
    return logp, old, torch.tensor([1.0, -1.0, 0.5, -0.5]), mask, is_replay, torch.rand(n, t, generator=g)


@pytest.mark.parametrize("replay_rows", [(), (3,), (0, 1, 2, 3)])
def test_tensor_stats_equal_float_stats_and_need_no_host_sync(replay_rows):
    logp, old, adv, mask, is_replay, ent = _inputs(replay_rows)
    kw = dict(onpolicy_term=partial(losses.clipped_ratio_term, clip_eps=0.2),
              replay_term=partial(losses.shaped_replay_term, beta=0.1), denominator=10.0, entropy_tok=ent,
              entropy_coef=0.01)
    _, floats = losses.mixed_policy_loss(logp, old, adv, mask, is_replay, **kw)
    with counting() as c:
        _, tensors = losses.mixed_policy_loss(logp, old, adv, mask, is_replay, tensor_stats=True, **kw)
    assert c.total == 0, c.counts
    assert floats.keys() == tensors.keys()
    for k, v in floats.items():
        assert isinstance(tensors[k], torch.Tensor) and tensors[k].dim() == 0
        assert float(tensors[k]) == pytest.approx(v, rel=1e-5, abs=1e-7), k
