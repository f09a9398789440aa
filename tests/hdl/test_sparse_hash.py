"""Amaranth-simulator tests of the MurmurHash3 hash unit against ``zen.murmur3_32``,
``zen.partition_of`` and the ``mmh3`` reference package."""
import mmh3
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from treenic.hdl.sparse.hash import LATENCY, MOD_STAGES, Murmur3HashUnit, modulo_magic
from treenic.hdl.sparse.simdrive import pack, run_stream_unit, unpack
from treenic.sparse.zen import murmur3_32, partition_of

EDGE_KEYS = [0, 1, 2, 3, 1000, 0xFFFFFFFE, 0xFFFFFFFF, 0x74736574, 0x80000000]


def _hash_rtl(keys, *, lanes, seed, pbits=0, workers=None, p_valid=1.0, p_ready=1.0,
              rng_seed=0, lut_multiplies=0):
    keys = list(keys) + [0] * (-len(keys) % lanes)
    beats = [pack(keys[b:b + lanes], 32) for b in range(0, len(keys), lanes)]
    dut = Murmur3HashUnit(lanes=lanes, partition_bits=pbits, workers=workers,
                          lut_multiplies=lut_multiplies)
    out, cycles = run_stream_unit(dut, beats, p_valid=p_valid, p_ready=p_ready, seed=rng_seed,
                                  setup=lambda ctx: ctx.set(dut.seed, seed))
    pw = max(1, dut.partition_bits)
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


def test_modulo_magic_exact_at_the_edges():
    """q = (h * M) >> shift equals h // n for every n at the dividends where a round-up
    magic number would first fail (multiples of n and their neighbours, 2**32 - 1)."""
    rng = np.random.default_rng(5)
    for n in list(range(1, 300)) + [1000, 4095, 4097, 65535, 65536] + \
            rng.integers(2, 65536, 200).tolist():
        magic, shift = modulo_magic(int(n))
        assert magic < 1 << 33
        top = (2**32 - 1) // n * n
        hs = {0, 1, n - 1, n, n + 1, top - 1, top, 2**32 - 1, *rng.integers(0, 2**32, 64).tolist()}
        for h in (h for h in hs if 0 <= h < 2**32):
            assert (h * magic) >> shift == h // n, (n, h)


@settings(max_examples=10, deadline=None)
@given(keys=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=40),
       seed=st.integers(0, 2**32 - 1), lanes=st.sampled_from([1, 2, 3]),
       workers=st.sampled_from([3, 5, 6, 7, 12, 100, 1000, 65535]), rng_seed=st.integers(0, 1000))
def test_any_worker_count_with_stalls(keys, seed, lanes, workers, rng_seed):
    """partition = murmur3 mod n for a non-power-of-two n (multiply-high path), under stalls."""
    h, p, _ = _hash_rtl(keys, lanes=lanes, seed=seed, workers=workers, p_valid=0.6,
                        p_ready=0.6, rng_seed=rng_seed)
    k = np.array(keys, np.uint32)
    assert np.array_equal(h[:len(keys)], murmur3_32(k, seed))
    assert np.array_equal(p[:len(keys)], partition_of(k, workers, seed))


def test_modulo_path_sustains_one_beat_per_cycle():
    lanes, n = 2, 64
    keys = np.random.default_rng(4).integers(0, 2**32, n * lanes).tolist()
    h, p, cycles = _hash_rtl(keys, lanes=lanes, seed=9, workers=6)
    assert np.array_equal(p, partition_of(np.array(keys, np.uint32), 6, 9))
    assert cycles == n + LATENCY + MOD_STAGES, cycles


def test_one_beat_per_cycle_sustained():
    lanes, n = 4, 64
    keys = np.random.default_rng(3).integers(0, 2**32, n * lanes).tolist()
    h, _, cycles = _hash_rtl(keys, lanes=lanes, seed=7, pbits=2)
    assert np.array_equal(h, murmur3_32(np.array(keys, np.uint32), 7))
    assert cycles == n + LATENCY, cycles      # one beat a cycle: no bubble from the credits


def test_bad_parameters_rejected():
    with pytest.raises(ValueError, match="lanes"):
        Murmur3HashUnit(lanes=0)
    with pytest.raises(ValueError, match="partition_bits"):
        Murmur3HashUnit(partition_bits=17)
    with pytest.raises(ValueError, match="workers"):
        Murmur3HashUnit(workers=0)
    with pytest.raises(ValueError, match="workers"):
        Murmur3HashUnit(workers=65537)
    with pytest.raises(ValueError, match="contradicts"):
        Murmur3HashUnit(partition_bits=2, workers=6)
    assert Murmur3HashUnit(workers=8).latency == LATENCY
    assert Murmur3HashUnit(workers=6).latency == LATENCY + MOD_STAGES


def test_csd_digits_rebuild_the_constants():
    from treenic.hdl.sparse.hash import _C1, _C2, _F1, _F2, csd_digits
    for c in (_C1, _C2, _F1, _F2, 5, 0xFFFFFFFF, 0x80000000, 0x55555555):
        digits = csd_digits(c)
        assert sum(d << p for p, d in digits) % 2**32 == c
        assert all(b[0] - a[0] >= 2 for a, b in zip(digits, digits[1:]))


@settings(max_examples=6, deadline=None)
@given(keys=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=24),
       seed=st.integers(0, 2**32 - 1), luts=st.integers(1, 4), rng_seed=st.integers(0, 1000))
def test_lut_multiplies_bit_exact_with_stalls(keys, seed, luts, rng_seed):
    """Constant multiplies as shift-add trees (lut_multiplies): the same hash, the same
    latency; a wrong digit would fail the edge keys."""
    keys = EDGE_KEYS + keys
    h, p, _ = _hash_rtl(keys, lanes=2, seed=seed, pbits=3, p_valid=0.6, p_ready=0.6,
                        rng_seed=rng_seed, lut_multiplies=luts)
    k = np.array(keys, np.uint32)
    assert np.array_equal(h[:len(keys)], murmur3_32(k, seed))
    assert np.array_equal(p[:len(keys)], partition_of(k, 8, seed))
    assert Murmur3HashUnit(lanes=2, lut_multiplies=luts).latency == LATENCY


def test_lut_multiplies_is_validated():
    with pytest.raises(ValueError, match="lut_multiplies"):
        Murmur3HashUnit(lanes=2, lut_multiplies=5)


def test_lut_order_fewest_digits_first():
    from treenic.hdl.sparse.hash import _LUT_ORDER, csd_digits
    counts = [len(csd_digits(c)) for c in _LUT_ORDER]
    assert counts == sorted(counts) and len(set(_LUT_ORDER)) == 4


def test_latency_is_the_documented_contract():
    """One beat in an empty pipeline comes out exactly ``latency`` cycles later: 15 stages
    (three per constant multiply: operand, partial products, sum; the last stage is the
    output FIFO's write), 21 with the modulo."""
    from treenic.hdl.sparse.hash import MULTIPLY_STAGES
    assert (LATENCY, MULTIPLY_STAGES) == (15, 3)
    for workers, luts in ((16, 0), (16, 2), (12, 0)):
        latency = LATENCY + (MOD_STAGES if workers & (workers - 1) else 0)
        _, _, cycles = _hash_rtl([5, 6], lanes=2, seed=3, workers=workers,
                                 lut_multiplies=luts)
        assert cycles == latency + 1, (workers, luts, cycles)


@pytest.mark.parametrize("workers", [16, 12])
def test_input_stops_when_the_fifo_is_full(workers):
    """With the consumer stalled, the unit takes exactly as many beats as its output FIFO
    holds (latency + 1) and then drops ``i.ready``; ``i.ready`` is a register (raising
    ``o.ready`` does not raise it in the same cycle); nothing is lost or duplicated."""
    from amaranth.sim import Simulator
    dut = Murmur3HashUnit(lanes=2, workers=workers)
    depth = dut.latency + 1
    keys = list(range(100, 100 + 2 * 3 * depth))
    got, accepted = [], []

    async def bench(ctx):
        ctx.set(dut.seed, 11)
        ctx.set(dut.o.ready, 0)
        ctx.set(dut.i.valid, 1)
        for _ in range(3 * depth):                       # the consumer is stalled
            ctx.set(dut.i.payload.as_value(), pack(keys[2 * len(accepted):][:2], 32))
            if ctx.get(dut.i.ready):
                accepted.append(ctx.get(dut.i.payload.as_value()))
            await ctx.tick()
        assert len(accepted) == depth
        ctx.set(dut.o.ready, 1)
        assert ctx.get(dut.o.valid) and not ctx.get(dut.i.ready)
        ctx.set(dut.i.valid, 0)
        for _ in range(depth + 5):
            if ctx.get(dut.o.valid):
                got.append(ctx.get(dut.o.payload.as_value()))
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    sent = [k for word in accepted for k in unpack(word, 32, 2)]
    assert sent == keys[:2 * depth]
    hashes = [x for word in got for x in unpack(word, 32, 2)]
    assert hashes == murmur3_32(np.array(sent, np.uint32), 11).tolist()
