"""`run.malloc` (exgrpo_core/run/allocator.py): freed large tensors are reused instead of paged in anew."""

from __future__ import annotations

import resource

import pytest
import torch

from exgrpo_core.config.load import ConfigError, load_config
from exgrpo_core.run import allocator
from exgrpo_core.run.session import open_session


def _page_faults(mode: str) -> int:
    """Minor page faults of five 113 MB allocations (the tied embedding's gradient size) under `mode`."""
    previous = allocator.use(mode)
    try:
        torch.zeros(49152, 576).sum()  # the first one may grow the heap
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(5):
            torch.zeros(49152, 576).sum()
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    finally:
        allocator.use(previous)


def test_reuse_serves_large_tensors_from_mapped_pages():
    assert allocator.supported()  # the CI machine runs glibc: a silent no-op would hide a regression
    system, reuse = _page_faults("system"), _page_faults("reuse")
    assert system > 5 * 20_000  # each 113 MB tensor is a fresh mmap: ~27,600 4-KiB pages faulted in
    assert reuse < 1_000


def test_unknown_mode_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown run.malloc 'jemalloc'"):
        allocator.use("jemalloc")
    with pytest.raises(ConfigError, match="malloc"):
        load_config("tiny", ["run.malloc=jemalloc"])


@pytest.mark.parametrize("mode", ["reuse", "system"])
def test_session_applies_the_setting_and_restores_it_on_close(tmp_path, mode):
    before = allocator.current()
    cfg = load_config("tiny", [f"run.output_dir={tmp_path}", f"run.db_url=sqlite:///{tmp_path / 'x.db'}",
                               f"run.malloc={mode}"])
    s = open_session(cfg, verify=lambda t, a: [(0.0, "wrong")] * len(t))
    try:
        assert allocator.current() == mode
    finally:
        s.close()
    assert allocator.current() == before
