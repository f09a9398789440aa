"""Amaranth-simulator tests of the RedSync grid-threshold source against the golden
``select._grid_threshold`` (float64 arithmetic, double rounding to float32), and of the
top-k unit's SEARCH mode served by it against ``select.binary_search_histogram``."""
import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

from treenic.hdl.sparse.search import GRID_LAYOUT
from treenic.hdl.sparse.simdrive import run_stream_unit
from treenic.hdl.sparse.threshold import POINT_CYCLES, SETUP_CYCLES, GridThresholdSource
from treenic.sparse import select

from test_sparse_topk_search import check_search, spread_chunks

MAX_FINITE = 0x7F7FFFFF


def rtl_thresholds(base_key, top_key, depth, requests, *, p_ready=1.0, seed=0):
    """Serve ``requests`` [(start, step, count)] with the RTL source; returns the answers
    in order and the cycles from the first request offered to the last answer taken."""
    dut = GridThresholdSource()
    words = [GRID_LAYOUT.const({"start": a, "step": b, "count": c}).as_value().value
             for a, b, c in requests]

    def setup(ctx):
        ctx.set(dut.base, base_key)
        ctx.set(dut.top, top_key)
        ctx.set(dut.depth, depth)
    return run_stream_unit(dut, words, n_out=sum(c for *_, c in requests), i="grid", o="thr",
                           p_ready=p_ready, seed=seed, setup=setup)


def golden(base_key, top_key, depth, start, step, count):
    base, top = select.key_to_float(base_key), select.key_to_float(top_key)
    return [int(select._grid_threshold(base, top, start + j * step, depth))
            for j in range(count)]


#: float32 keys: anywhere in the finite range, subnormals and their neighbours, near 1
keys = st.one_of(st.integers(0, MAX_FINITE), st.integers(0, 0x00FFFFFF),
                 st.integers(0x3F000000, 0x3F900000), st.sampled_from([0, 1, 0x00800000,
                                                                      MAX_FINITE]))


@st.composite
def requests(draw):
    depth = draw(st.integers(1, 30))
    out = []
    for _ in range(draw(st.integers(1, 3))):
        count = draw(st.integers(1, min(7, (1 << depth) + 1)))
        step = draw(st.integers(1, max(1, (1 << depth) // count)))
        start = draw(st.integers(0, (1 << depth) - step * (count - 1)))
        out.append((start, step, count))
    return depth, out


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(base=keys, top=keys, req=requests(), p_ready=st.sampled_from([1.0, 0.5]),
       seed=st.integers(0, 99))
def test_grid_thresholds_bit_exact(base, top, req, p_ready, seed):
    """Every answer equals the golden's float64 grid threshold: random keys over the whole
    finite range (huge and tiny spans, base above top, subnormal results), any depth."""
    depth, reqs = req
    got, _ = rtl_thresholds(base, top, depth, reqs, p_ready=p_ready, seed=seed)
    want = [t for r in reqs for t in golden(base, top, depth, *r)]
    assert got == want, (hex(base), hex(top), depth, reqs)


def test_rounding_edge_cases():
    """Hand-picked cases: a span that rounds (exponents 276 apart), the smallest
    subnormals, results that round to zero, ties to even in the float32 rounding, equal
    base and top, a zero top (``lower="zero"`` with an empty sign)."""
    cases = [(1, MAX_FINITE), (MAX_FINITE, 1), (0, 1), (1, 2), (0x00000003, 0x00000004),
             (0x3F800000, 0x3F800001), (0x3F800001, 0x3F800000), (0x3F800000, 0x3F800000),
             (0, 0), (0x3F800000, 0), (0x00800000, 0x01000000), (0x4B000000, 0x4B000003)]
    for base, top in cases:
        for depth in (1, 2, 16, 30):
            step = max(1, (1 << depth) // 8)          # grid points within [0, 2**depth]
            reqs = [(0, step, min(7, (1 << depth) // step + 1)), ((1 << depth) - 1, 1, 2)]
            got, _ = rtl_thresholds(base, top, depth, reqs)
            want = [t for r in reqs for t in golden(base, top, depth, *r)]
            assert got == want, (hex(base), hex(top), depth)


def test_latency_contract():
    """SETUP_CYCLES once a request, then POINT_CYCLES a grid point at full rate."""
    for count in (1, 7):
        _, cycles = rtl_thresholds(0x3F000000, 0x40000000, 16, [(100, 3, count)])
        # the consumer counts from the cycle the request is offered
        assert cycles == 1 + SETUP_CYCLES + count * POINT_CYCLES, (count, cycles)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=spread_chunks(), k=st.sampled_from([1, 2, 3, 5, 8]), depth=st.sampled_from([2, 5, 16]),
       H=st.sampled_from([1, 3]), strict=st.booleans(), sign=st.sampled_from([0, 1, -1]),
       seed=st.integers(0, 99))
def test_search_served_by_the_rtl_source(x, k, depth, H, strict, sign, seed):
    """The unit's SEARCH with its grid answered by the RTL source: the selection, every
    request, the passes and the outcome equal ``binary_search_histogram``."""
    check_search(x, k, lanes=4, depth=depth, search_bits=H, strict=strict, sign=sign,
                 p_valid=0.8, p_ready=0.7, seed=seed, rtl_source=True)


def test_search_served_by_the_rtl_source_lower_zero():
    rng = np.random.default_rng(3)
    x = rng.standard_normal(64).astype(np.float32)
    check_search(x, 5, lanes=4, lower="zero", depth=12, search_bits=4, rtl_source=True)
    check_search(np.full(32, 2.0, np.float32), 5, lanes=2, depth=8, rtl_source=True)
