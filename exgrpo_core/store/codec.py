"""Binary encoding of per-token arrays for the experience database (int32 / float32, little-endian).

Token ids are stored as int32 and behaviour log-probs as float32 (4 bytes a token instead of a JSON
list): float64 log-probs from the trainer lose precision beyond ~1e-7 relative, far below what the
importance weight w_t = exp(logp_new - logp_old) can resolve in training.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_INT32 = np.dtype("<i4")
_FLOAT32 = np.dtype("<f4")


class CodecError(ValueError):
    """An array cannot be encoded (out of range, not 1-D) or a blob cannot be decoded."""


def _encode(values: Sequence | np.ndarray, dtype: np.dtype, what: str) -> bytes:
    try:
        arr = np.asarray(values)
        if arr.ndim != 1:
            raise CodecError(f"{what} must be a 1-D sequence, got shape {arr.shape}")
        if arr.size and dtype.kind == "i":
            if arr.dtype.kind not in "iub":
                raise CodecError(f"{what} must be integers, got dtype {arr.dtype}")
            lo, hi = int(arr.min()), int(arr.max())
            if lo < np.iinfo(dtype).min or hi > np.iinfo(dtype).max:
                raise CodecError(f"{what} out of int32 range: min {lo}, max {hi}")
        return arr.astype(dtype, copy=False).tobytes()
    except (TypeError, ValueError, OverflowError) as e:
        if isinstance(e, CodecError):
            raise
        raise CodecError(f"cannot encode {what}: {e}") from e


def _decode(blob: bytes | memoryview | None, dtype: np.dtype, what: str) -> np.ndarray:
    if blob is None:
        return np.zeros(0, dtype=dtype)
    if len(blob) % dtype.itemsize:
        raise CodecError(f"{what} blob of {len(blob)} bytes is not a multiple of {dtype.itemsize}")
    return np.frombuffer(bytes(blob), dtype=dtype)


def encode_token_ids(ids: Sequence[int] | np.ndarray) -> bytes:
    """Token ids [T] -> T * 4 bytes (int32 little-endian)."""
    return _encode(ids, _INT32, "token ids")


def decode_token_ids(blob: bytes | memoryview | None) -> list[int]:
    """T * 4 bytes -> token ids [T] as Python ints (None -> [])."""
    return _decode(blob, _INT32, "token ids").tolist()


def encode_logprobs(values: Sequence[float] | np.ndarray) -> bytes:
    """Log-probs [T] -> T * 4 bytes (float32 little-endian)."""
    return _encode(values, _FLOAT32, "log-probs")


def decode_logprobs(blob: bytes | memoryview | None) -> list[float]:
    """T * 4 bytes -> log-probs [T] as Python floats (float32 precision; None -> [])."""
    return _decode(blob, _FLOAT32, "log-probs").tolist()
