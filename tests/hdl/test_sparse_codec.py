"""Amaranth-simulator tests of the sparse message encoder/decoder against the golden codec
``treenic.sparse.codec`` (format, decision rule, round trip)."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from treenic.hdl.sparse.codec import SparseDecoder, SparseEncoder
from treenic.hdl.sparse.simdrive import run_stream_unit
from treenic.sparse import codec
from treenic.sparse.base import SparseError

MAX = 256


def pair_words(idx, val):
    """Encoder input: one pair per beat, ``last`` on the final one, a ``none`` beat if empty."""
    v = np.asarray(val, np.float32).view(np.uint32)
    if len(idx) == 0:
        return [(1 << 64) | (1 << 65)]
    return [int(i) | (int(x) << 32) | (int(n == len(idx) - 1) << 64)
            for n, (i, x) in enumerate(zip(idx, v))]


def encode_rtl(idx, val, chunk, **kw):
    dut = SparseEncoder(max_chunk=MAX)
    out, _ = run_stream_unit(dut, pair_words(idx, val), setup=lambda ctx: ctx.set(dut.chunk, chunk),
                             until=lambda w: (w >> 32) & 1, **kw)
    return np.array([w & 0xFFFFFFFF for w in out], np.uint32), [w >> 32 for w in out]


def decode_rtl(words, chunk, **kw):
    dut = SparseDecoder(max_chunk=MAX)
    inp = [int(w) | (int(n == len(words) - 1) << 32) for n, w in enumerate(words)]
    out, _ = run_stream_unit(dut, inp, setup=lambda ctx: ctx.set(dut.chunk, chunk),
                             until=lambda w: (w >> 64) & 1, **kw)
    pairs = [(w & 0xFFFFFFFF, (w >> 32) & 0xFFFFFFFF) for w in out if not (w >> 65) & 1]
    return (np.array([p[0] for p in pairs], np.int64), np.array([p[1] for p in pairs], np.uint32))


@st.composite
def messages(draw):
    chunk = draw(st.sampled_from([32, 33, 64, 100, 256]))
    count = draw(st.integers(0, chunk))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    idx = np.sort(rng.choice(chunk, count, replace=False))
    val = rng.standard_normal(count).astype(np.float32)
    return idx, val, chunk


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(msg=messages(), seed=st.integers(0, 99))
def test_encoder_matches_golden_and_decoder_round_trips(msg, seed):
    idx, val, chunk = msg
    gold = codec.encode_message(idx, val, chunk)
    words, lasts = encode_rtl(idx, val, chunk, p_valid=0.7, p_ready=0.6, seed=seed)
    assert np.array_equal(words, gold), (words[:4], gold[:4])
    assert lasts == [0] * (len(gold) - 1) + [1]
    d_idx, d_val = decode_rtl(gold, chunk, p_valid=0.7, p_ready=0.6, seed=seed + 1)
    assert np.array_equal(d_idx, idx)
    assert np.array_equal(d_val, val.view(np.uint32))


def test_decision_rule_boundary():
    # bitmap iff ceil(C/32) < L: at C = 256 (8 bitmap words) L = 8 sends pairs, L = 9 a bitmap
    for count, fmt in ((8, codec.FORMAT_PAIRS), (9, codec.FORMAT_BITMAP)):
        idx = np.arange(count) * 3
        words, _ = encode_rtl(idx, np.ones(count, np.float32), 256)
        assert int(words[0]) >> 31 == fmt
        assert words.size == codec.message_words(count, 256)


def test_two_messages_back_to_back_reuse_cleared_bitmap():
    """The encoder clears its bitmap buffer while emitting: a second message is clean."""
    dut = SparseEncoder(max_chunk=MAX)
    a_idx, a_val = np.arange(0, 256, 2), np.ones(128, np.float32)
    b_idx, b_val = np.array([1, 200]), np.array([2.0, 3.0], np.float32)
    c_idx, c_val = np.array([5, 7, 9, 11, 13, 15, 17, 19, 21, 23]), np.ones(10, np.float32)
    inputs = pair_words(a_idx, a_val) + pair_words(b_idx, b_val) + pair_words(c_idx, c_val)
    gold = np.concatenate([codec.encode_message(i, v, 256) for i, v in
                           ((a_idx, a_val), (b_idx, b_val), (c_idx, c_val))])
    out, _ = run_stream_unit(dut, inputs, n_out=gold.size, p_ready=0.7, seed=3,
                             setup=lambda ctx: ctx.set(dut.chunk, 256))
    assert np.array_equal(np.array([w & 0xFFFFFFFF for w in out], np.uint32), gold)


def test_golden_rejects_malformed():
    with pytest.raises(SparseError, match="ascending"):
        codec.encode_message([3, 2], [1.0, 2.0], 8)
    w = codec.encode_message([1], [1.0], 64)
    with pytest.raises(SparseError, match="malformed"):
        codec.decode_message(w[:-1], 64)
