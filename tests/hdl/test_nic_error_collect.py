"""ErrorCollect (hdl/nic/errors.py) against its golden model: random events and clears,
flags and count compared every cycle."""
import random

import pytest

from treenic.hdl.nic.errors import ErrorCollect, error_collect_model, event_sources
from treenic.hdl.nic.params import ErrBit

from nic_unit_helpers import SMALL, simulate


@pytest.mark.parametrize("seed", [1, 2])
def test_error_collect_matches_model(seed):
    dut = ErrorCollect(params=SMALL)
    rnd = random.Random(seed)
    src = event_sources(SMALL)
    trace = []
    for _ in range(300):
        events = {b: rnd.getrandbits(n) if rnd.random() < 0.3 else 0
                  for b, n in src.items() if n}
        trace.append((events, rnd.random() < 0.05, rnd.random() < 0.03))
    expected = list(error_collect_model(SMALL, trace))

    async def tb(ctx):
        for (events, link_error, clear), (flags, count) in zip(trace, expected):
            for b, v in events.items():
                ctx.set(dut.events[b.name.lower()], v)
            ctx.set(dut.link_error, link_error)
            ctx.set(dut.clear, clear)
            await ctx.tick()
            assert ctx.get(dut.err_flags) == flags
            assert ctx.get(dut.err_count) == count
            assert ctx.get(dut.error) == (flags != 0)

    simulate(dut, tb)
    assert any(f for f, _ in expected) and any(c > 5 for _, c in expected)


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_error_collect_rejects_bad_params():
    with pytest.raises(TypeError):
        ErrorCollect(params=None)


def test_every_error_bit_has_a_source():
    src = event_sources(SMALL)
    assert set(src) == set(ErrBit)
