"""Amaranth-simulator tests of the MurmurHash3 hash unit against ``zen.murmur3_32``,
``zen.partition_of`` and the ``mmh3`` reference package."""
import mmh3
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from treenic.hdl.sparse.hash import LATENCY, Murmur3HashUnit
from treenic.hdl.sparse.simdrive import pack, run_stream_unit, unpack
from treenic.sparse.zen import murmur3_32, partition_of

EDGE_KEYS = [0, 1, 2, 3, 1000, 0xFFFFFFFE, 0xFFFFFFFF, 0x74736574, 0x80000000]


def _hash_rtl(keys, *, lanes, seed, pbits, p_valid=1.0, p_ready=1.0, rng_seed=0):
    keys = list(keys) + [0] * (-len(keys) % lanes)
    beats = [pack(keys[b:b + lanes], 32) for b in range(0, len(keys), lanes)]
    dut = Murmur3HashUnit(lanes=lanes, partition_bits=pbits)
    out, cycles = run_stream_unit(dut, beats, p_valid=p_valid, p_ready=p_ready, seed=rng_seed,
                                  setup=lambda ctx: ctx.set(dut.seed, seed))
    pw = max(1, pbits)
    hashes, parts = [], []
    for word in out:
        hashes += unpack(word, 32, lanes)
        parts += unpack(word >> (32 * lanes), pw, lanes)
    return np.array(hashes, np.uint32), np.array(parts), cycles


def test_published_vectors_and_mmh3():
    for seed in (0, 1, 0x2A, 0x9747B28C):
        h, _, _ = _hash_rtl(EDGE_KEYS, lanes=3, seed=seed, pbits=0)
        ref = [mmh3.hash(k.to_bytes(4, "little"), seed, signed=False) for k in EDGE_KEYS]
        assert h[:len(EDGE_KEYS)].tolist() == ref
        assert np.array_equal(h[:len(EDGE_KEYS)], murmur3_32(np.array(EDGE_KEYS, np.uint32), seed))
    assert murmur3_32(np.uint32(0x74736574), 0) == 0xBA6BD213


@settings(max_examples=12, deadline=None)
@given(keys=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=40),
       seed=st.integers(0, 2**32 - 1), lanes=st.sampled_from([1, 2, 4]),
       pbits=st.integers(0, 6), rng_seed=st.integers(0, 1000))
def test_random_keys_with_stalls(keys, seed, lanes, pbits, rng_seed):
    h, p, _ = _hash_rtl(keys, lanes=lanes, seed=seed, pbits=pbits, p_valid=0.6, p_ready=0.6,
                        rng_seed=rng_seed)
    k = np.array(keys, np.uint32)
    assert np.array_equal(h[:len(keys)], murmur3_32(k, seed))
    if pbits:
        assert np.array_equal(p[:len(keys)], partition_of(k, 1 << pbits, seed))


def test_one_beat_per_cycle_sustained():
    lanes, n = 4, 64
    keys = np.random.default_rng(3).integers(0, 2**32, n * lanes).tolist()
    h, _, cycles = _hash_rtl(keys, lanes=lanes, seed=7, pbits=2)
    assert np.array_equal(h, murmur3_32(np.array(keys, np.uint32), 7))
    assert cycles <= n + LATENCY + 1, cycles


def test_bad_parameters_rejected():
    with pytest.raises(ValueError, match="lanes"):
        Murmur3HashUnit(lanes=0)
    with pytest.raises(ValueError, match="partition_bits"):
        Murmur3HashUnit(partition_bits=17)
