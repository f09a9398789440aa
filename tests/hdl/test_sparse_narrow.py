"""Amaranth-simulator test of the W-pair → one-pair narrowing adapter vs its golden."""
import random

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from treenic.hdl.sparse.narrow import PairNarrower, narrow_golden
from treenic.hdl.sparse.simdrive import run_stream_unit


def _pack_beat(count, last, idx, val, W):
    word, pos = count, (W).bit_length()
    word |= last << pos
    pos += 1
    for l in range(W):
        word |= idx[l] << (pos + 32 * l)
    pos += 32 * W
    for l in range(W):
        word |= val[l] << (pos + 32 * l)
    return word


def _beats(rng, W, n):
    beats = []
    for b in range(n):
        count = rng.choice([0, 0, W, rng.randint(0, W)])
        idx = [rng.getrandbits(32) for _ in range(W)]
        val = [rng.getrandbits(32) for _ in range(W)]
        beats.append((count, int(b == n - 1 or rng.random() < 0.2), idx, val))
    return beats


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), W=st.sampled_from([1, 2, 4, 16]))
def test_matches_golden_with_stalls(seed, W):
    rng = random.Random(seed)
    beats = _beats(rng, W, rng.randint(1, 12))
    gold = narrow_golden(beats)
    words = [_pack_beat(c, l, i, v, W) for c, l, i, v in beats]
    out, _ = run_stream_unit(PairNarrower(lanes=W), words, n_out=len(gold), p_valid=0.7,
                             p_ready=0.6, seed=seed)
    got = [(w & 0xFFFFFFFF, (w >> 32) & 0xFFFFFFFF, w >> 64) for w in out]
    assert got == gold


def test_empty_beats_cost_nothing():
    W = 4
    beats = [(0, 0, [0] * W, [0] * W)] * 20 + [(1, 1, [7] * W, [9] * W)]
    words = [_pack_beat(c, l, i, v, W) for c, l, i, v in beats]
    out, cycles = run_stream_unit(PairNarrower(lanes=W), words, n_out=2)
    assert [(w & 0xFFFFFFFF, w >> 64) for w in out] == [(7, 0), (0, 1)]
    assert cycles <= 21 + 4


def test_bad_lanes():
    with pytest.raises(ValueError, match="lanes"):
        PairNarrower(lanes=0)
