"""Weight push + proof after each optimiser step, with an engine that holds its own copy of the model
(what vLLM does), one that loads correctly and one that silently drops the push."""

from __future__ import annotations

import copy

import pytest
import torch

from exgrpo_core import metrics as M
from exgrpo_core.models import load as models
from exgrpo_core.rollout import sync as engine_sync


class CopyEngine:
    """Holds a bf16 copy of the policy, like a colocated vLLM engine; `drop` ignores pushes."""

    def __init__(self, model, drop: bool = False):
        self.copy = copy.deepcopy(model).to(torch.bfloat16)
        self.drop = drop

    def push_weights(self, named):
        if self.drop:
            return 0
        own = dict(self.copy.named_parameters())
        with torch.no_grad():
            for n, p in named:
                own[n].copy_(p.detach().to(torch.bfloat16))
        return len(own)

    def checksums(self, names):
        own = dict(self.copy.named_parameters())
        return {n: float(own[n].double().sum()) for n in names}

    def probe(self, ids):
        return engine_sync.trainer_probe(self.copy, ids)


def _perturb(model):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))


@pytest.fixture
def model():
    torch.manual_seed(0)
    m, _ = models.load_policy("tiny", dtype="float32", seed=0)
    return m


def test_good_push_passes_and_reports_gap(model):
    eng = CopyEngine(model)
    _perturb(model)
    stats = engine_sync.push_and_check(eng, model, [1, 5, 6, 7, 8, 9], torch.bfloat16)
    assert set(stats) == {M.ENGINE_SYNC_GAP, M.ENGINE_SYNC_S}
    assert 0 <= stats[M.ENGINE_SYNC_GAP] < 0.05  # bf16 rounding only


def test_dropped_push_is_caught(model):
    eng = CopyEngine(model, drop=True)
    _perturb(model)
    with pytest.raises(engine_sync.EngineSyncError, match="differ from the trainer"):
        engine_sync.push_and_check(eng, model, [1, 5, 6], torch.bfloat16)


def test_norm_names_and_checksum_compare(model):
    names = engine_sync.norm_names(model)
    assert names and all(n.endswith("norm.weight") for n in names)
    ref = engine_sync.trainer_checksums(model, names, torch.float32)
    assert engine_sync.compare_checksums(ref, dict(ref)) == []
    off = {**ref, names[0]: ref[names[0]] + 1.0}
    assert engine_sync.compare_checksums(ref, off) == [names[0]]
    assert engine_sync.compare_checksums(ref, {}) == names
