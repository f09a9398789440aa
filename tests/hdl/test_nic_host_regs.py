"""HostRegs (hdl/nic/host_regs.py): register writes and reads against the register map
(hdl/nic/params.py: Reg, PortCounter, the region layout), every read answering exactly
REGS_READ_LATENCY cycles after ``re``, back-to-back reads, rejected writes flagged, the
table / ORDER / buffer writes decoded (and refused while RUNNING)."""
import random

from treenic.hdl.nic.host_regs import REGS_READ_LATENCY, HostRegs
from treenic.hdl.nic.params import ID_VALUE, PortCounter, Reg

from nic_unit_helpers import SMALL, simulate


def test_host_regs_write_read_and_decode():
    p = SMALL
    dut = HostRegs(params=p)
    rnd = random.Random(3)
    counters = {(i, k): rnd.getrandbits(32) for i in range(p.ports) for k in PortCounter}

    async def tb(ctx):
        h = dut.host
        for (i, k), v in counters.items():
            ctx.set(dut.counters[i][k], v)
        ctx.set(dut.cycles, 1234)
        ctx.set(dut.err_flags, 0b100)

        async def wr(addr, val, **expect):
            ctx.set(h.addr, addr)
            ctx.set(h.wdata, val)
            ctx.set(h.we, 1)
            got = {k: ctx.get(getattr(dut, k)) for k in expect}
            await ctx.tick()
            ctx.set(h.we, 0)
            assert got == expect, (hex(addr), got, expect)

        await wr(Reg.NODE, 7)
        await wr(Reg.LOCKSTEP, 99)
        await wr(Reg.ENTRIES, p.max_entries + 5, ev_table_index=1)
        await wr(Reg.ELEMENTS, p.depth + 1, ev_host_range=1)
        await wr(Reg.ELEMENTS, 40, ev_host_range=0)
        await wr(Reg.FLOWS, 3)
        await wr(Reg.PEER + 1, 0xABCD)
        await wr(Reg.CTRL, 1, ctrl_start=1)
        last_word = p.row_words - 1
        await wr(p.table_addr(3, last_word), 0x5555, table_en=1 << last_word, table_addr=3)
        await wr(p.table_addr(p.max_entries, 0), 1, table_en=0, ev_table_index=1)
        await wr(p.order_addr(2, 1), 5, order_we=1)
        await wr(p.buf_addr(9), 0x3F800000, ev_host_range=0)
        await wr(p.buf_addr(p.depth), 0, ev_host_range=1)
        ctx.set(dut.running, 1)
        await wr(p.table_addr(0, 0), 1, table_en=0, ev_table_index=1)
        await wr(p.order_addr(0, 0), 1, order_we=0)
        await wr(p.buf_addr(0), 1, ev_host_range=1)
        ctx.set(dut.running, 0)
        # back-to-back reads: each answers REGS_READ_LATENCY cycles after its ``re``
        want = {Reg.ID: ID_VALUE, Reg.NODE: 7, Reg.LOCKSTEP: 99,
                Reg.ENTRIES: p.max_entries + 1, Reg.ELEMENTS: 40, Reg.FLOWS: 3,
                Reg.PEER + 1: 0xABCD, Reg.CYCLES: 1234, Reg.ERR_FLAGS: 0b100,
                Reg.STATUS: 0b100,
                **{p.port_counter_addr(i, k): v for (i, k), v in counters.items()}}
        addrs = list(want)
        got = []
        for c in range(len(addrs) + REGS_READ_LATENCY):
            ctx.set(h.re, c < len(addrs))
            ctx.set(h.addr, addrs[c] if c < len(addrs) else 0)
            await ctx.tick()
            if c >= REGS_READ_LATENCY - 1 and len(got) < len(addrs):
                got.append(ctx.get(h.rdata))
        assert got == [want[a] for a in addrs]

    simulate(dut, tb)
