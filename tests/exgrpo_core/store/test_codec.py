"""Binary codec of token ids (int32) and log-probs (float32), little-endian."""

from __future__ import annotations

import numpy as np
import pytest

from exgrpo_core.store.codec import CodecError, decode_logprobs, decode_token_ids, encode_logprobs, encode_token_ids


def test_token_ids_round_trip_exactly_including_extremes_and_empty():
    rng = np.random.default_rng(0)
    for ids in ([], [0], [2**31 - 1, -(2**31), 7], rng.integers(0, 152_064, size=1000).tolist()):
        blob = encode_token_ids(ids)
        assert len(blob) == 4 * len(ids)
        assert decode_token_ids(blob) == list(ids)


def test_logprobs_round_trip_at_float32_precision_including_empty():
    rng = np.random.default_rng(1)
    values = (-rng.exponential(2.0, size=500)).tolist() + [0.0, -np.inf]
    back = decode_logprobs(encode_logprobs(values))
    np.testing.assert_array_equal(back, np.asarray(values, dtype=np.float32))
    np.testing.assert_allclose(back[:-1], values[:-1], rtol=1e-7)
    assert decode_logprobs(encode_logprobs([])) == [] and decode_logprobs(None) == []


def test_encoding_is_little_endian():
    # 1 = 01 00 00 00 and -1.0 = 00 00 80 bf in little-endian int32 / float32
    assert encode_token_ids([1]) == b"\x01\x00\x00\x00"
    assert encode_logprobs([-1.0]) == b"\x00\x00\x80\xbf"


@pytest.mark.parametrize("bad, match", [([2**31], "int32 range"), ([-(2**31) - 1], "int32 range"),
                                        ([1.5], "integers"), ([[1, 2]], "1-D")])
def test_bad_token_ids_are_rejected_by_name(bad, match):
    with pytest.raises(CodecError, match=match):
        encode_token_ids(bad)


def test_truncated_blob_is_rejected():
    with pytest.raises(CodecError, match="not a multiple of 4"):
        decode_token_ids(b"\x01\x00\x00")
