"""Shared buffer ports (``NicParams(shared_ports=True)``, :mod:`treenic.hdl.nic.share`):
the TX units on one buffer reader, the RX units on another and on one writer.  Small
fabrics with two-children trees (mesh:2x2 MultiTree: two RX ports accumulate into a
node's buffer in one step) and Ring run one all-reduce with and without random link
stalls, store-and-forward and cut-through; each equals the golden executor bit for bit
and sends the golden packetiser's flits.  The share's own contract -- one grant a cycle,
data to the granted client only -- and the merged writer's conflict flag are checked in
isolation."""
import numpy as np
import pytest
from amaranth.sim import Simulator

from treenic.hdl.nic import NicParams
from treenic.hdl.nic.buffer import READ_LATENCY
from treenic.hdl.nic.share import ReadShare, WriteMerge

from test_nic_cut_through import _check, _run as _run_cut


def _run(spec, alg, E, forward, *, stall=0):
    return _run_cut(spec, alg, E, forward, stall=stall, shared_ports=True)


CASES = [("mesh:2x2", "multitree", 29, "store", 0), ("mesh:2x2", "multitree", 29, "store", 70),
         ("mesh:2x2", "multitree", 29, "cut-through", 70), ("ring:4", "ring", 37, "store", 70)]


@pytest.mark.parametrize("spec,alg,E,forward,stall", CASES,
                         ids=[f"{c[0]}-{c[3]}-stall{c[4]}" for c in CASES])
def test_shared_ports_bit_exact(spec, alg, E, forward, stall):
    out, gold, images, params = _run(spec, alg, E, forward, stall=stall)
    assert params.shared_ports
    _check(out, gold, images, params)


def test_read_share_one_grant_and_data_to_its_client():
    dut = ReadShare(abits=8, lanes=2, clients=3)
    rng = np.random.default_rng(1)
    seen = []

    async def bench(ctx):
        pending = []                            # (cycle valid is due, client)
        for cycle in range(300):
            reqs = [int(rng.random() < 0.6) for _ in range(3)]
            for j, c in enumerate(dut.clients):
                ctx.set(c.req, reqs[j])
                ctx.set(c.addr, 10 * j + cycle % 7)
            grant_port = int(rng.random() < 0.7)
            ctx.set(dut.port.grant, grant_port)
            grants = [ctx.get(c.grant) for c in dut.clients]
            assert sum(grants) <= 1
            if any(reqs) and grant_port:
                j = grants.index(1)
                assert reqs[j] and ctx.get(dut.port.addr) == 10 * j + cycle % 7
                pending.append((cycle + READ_LATENCY, j))
            else:
                assert sum(grants) == 0
            due = [j for t, j in pending if t == cycle]
            ctx.set(dut.port.valid, int(bool(due)))
            valids = [ctx.get(c.valid) for c in dut.clients]
            assert valids == [int(bool(due) and j == due[0]) for j in range(3)], cycle
            seen.extend(due)
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert set(seen) == {0, 1, 2}               # the rotation serves every client


def test_write_merge_ors_one_writer_and_flags_two():
    dut = WriteMerge(abits=8, lanes=2, clients=3)

    async def bench(ctx):
        ctx.set(dut.clients[1].en, 0b10)
        ctx.set(dut.clients[1].addr, 42)
        ctx.set(dut.clients[1].data, (7 << 32) | 5)
        assert ctx.get(dut.port.en) == 0b10 and ctx.get(dut.port.addr) == 42
        assert ctx.get(dut.port.data) == 7 << 32 and not ctx.get(dut.conflict)
        ctx.set(dut.clients[2].en, 0b01)
        assert ctx.get(dut.conflict)

    sim = Simulator(dut)
    sim.add_testbench(bench)
    sim.run()


def test_shared_ports_refused_unless_bool():
    with pytest.raises(TypeError, match="shared_ports"):
        NicParams(shared_ports=1)
