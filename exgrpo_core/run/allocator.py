"""glibc malloc settings for CPU runs (`run.malloc`): keep freed memory for reuse.

Under glibc's defaults every large tensor (the tied embedding's 113 MB dense gradient in each
backward, logits blocks, activations) is a fresh `mmap`: it is paged in anew, one kernel page fault
per 4 KiB, and unmapped again when freed. On a cpu-demo train phase at B = 2 that kernel time was a
quarter of the CPU seconds (docs/benchmarks/speed.md). `reuse` serves large blocks from the heap
(M_MMAP_MAX = 0) and never gives freed memory back to the kernel (M_TRIM_THRESHOLD = -1; a 2 GiB
threshold still let a cpu-demo train phase's freed activations go), so later tensors land on pages
already mapped. Numbers are untouched; the resident size stays near its peak instead of
shrinking between steps. `system` restores glibc's defaults (its dynamic trim threshold excepted:
glibc's fixed 128 KiB start value is set). Elsewhere than glibc (macOS, musl) both are no-ops.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import platform

M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
SETTINGS = {"reuse": {M_MMAP_MAX: 0, M_TRIM_THRESHOLD: -1},  # -1: never trim (mallopt(3))
            "system": {M_MMAP_MAX: 65536, M_TRIM_THRESHOLD: 128 * 1024}}
_current: list[str] = ["system"]


@functools.cache
def _mallopt():
    """glibc's mallopt, or None where the C library is not glibc."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    fn = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return fn


def supported() -> bool:
    return _mallopt() is not None


def use(mode: str) -> str:
    """Switch this process's malloc to `mode` (`reuse` or `system`); returns the previous mode."""
    if mode not in SETTINGS:
        raise ValueError(f"unknown run.malloc {mode!r}; choose from {', '.join(SETTINGS)}")
    previous = _current[0]
    fn = _mallopt()
    if fn is not None:
        for param, value in SETTINGS[mode].items():
            if fn(param, value) != 1:
                raise OSError(f"mallopt({param}, {value}) failed")
    _current[0] = mode
    return previous


def current() -> str:
    return _current[0]
