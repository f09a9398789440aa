"""Block RAM whose read/write collisions are don't-care: :class:`BlockRam`, a FIFO on it,
:class:`BlockRamFIFO`, and interleaved banks of it with a port that reads consecutive
words, :class:`LaneBankedRam`.

A read port of an Amaranth :class:`~amaranth.lib.memory.Memory` that is not transparent
promises the *old* word when a write port writes the word it reads in the same cycle. The
ECP5's DP16KD keeps no such promise between its two ports (the read returns undefined data),
so Yosys keeps it in soft logic around every read port of every copy of the memory
(``memory_libmap``: "emulate read-first behavior"): the write delayed a cycle in registers,
an address compare, and a bypass mux after the RAM output::

    rd_addr ──► [DP16KD] ──4.3 ns──► (mux) ──► data        one more LUT level on every read,
    wr_addr ─► [reg] ─► (==) ─► [reg] ──┘                  the compare on the address path

:class:`BlockRam` drops the promise, as the block RAM does:

* **synthesis** (a platform): the memory carries Yosys' ``no_rw_check`` attribute, and the
  Trellis flow of :mod:`treenic.boards.synth` sets its read ports' collisions to don't-care
  before mapping (:data:`YOSYS_COLLISION_DONT_CARE`); no emulation logic is built;
* **simulation** (no platform: Amaranth's simulator, the Verilated models): a read that
  collides with a write returns the stored word XOR :func:`poison`, so every bit-exact test of
  a design built on it also shows that the design never *uses* such a read. A collision whose
  word nobody looks at (a port left enabled while its data is ignored) changes nothing.

Golden model: a plain ``Memory`` for every read that does not collide; a colliding read is
undefined. One write port; read ports synchronous and not transparent, in the write port's domain.
"""
from __future__ import annotations

from amaranth.hdl import Array, Const, Elaboratable, Module, Mux, Signal, Value
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["BlockRam", "BlockRamFIFO", "LaneBankedRam", "lanes_address", "poison",
           "registered_write", "MAX_READ_PORTS", "YOSYS_COLLISION_DONT_CARE"]

#: the most read ports a BlockRam may have (each is a copy of the memory on the FPGA)
MAX_READ_PORTS = 64

#: Yosys commands (``; ``-separated), run between ``synth_ecp5 -run :map_ram`` and ``-run
#: map_ram:``: every read port of a memory marked ``no_rw_check`` reads don't-care when it
#: collides with the write port (the mask has a bit per read port: one command per count)
YOSYS_COLLISION_DONT_CARE = "; ".join(
    f"setparam -set RD_COLLISION_X_MASK {n}'b{'1' * n} "
    f"t:$mem_v2 a:no_rw_check %i r:WR_PORTS=1 %i r:RD_PORTS={n} %i"
    for n in range(1, MAX_READ_PORTS + 1))


def poison(width: int) -> Const:
    """What a colliding read returns in simulation, XORed into the stored word: 0xA5 bytes
    (never 0, so an unchanged word cannot hide it)."""
    return Const(int("a5" * -(-width // 8), 16) & ((1 << width) - 1), width)


class BlockRam(memory.Memory):
    """A :class:`~amaranth.lib.memory.Memory` whose read/write collisions are don't-care.

    Parameters
    ----------
    shape, depth, init, attrs :
        As for :class:`~amaranth.lib.memory.Memory` (keyword-only; ``no_rw_check`` is added
        to *attrs*).

    Members
    -------
    As :class:`~amaranth.lib.memory.Memory`: ``read_port()`` (synchronous, not transparent;
    up to :data:`MAX_READ_PORTS`) and ``write_port()`` (exactly one).
    """

    def __init__(self, *, shape, depth, init, attrs=None, src_loc_at=0):
        super().__init__(shape=shape, depth=depth, init=init,
                         attrs={**(attrs or {}), "no_rw_check": 1}, src_loc_at=1 + src_loc_at)

    def read_port(self, *, domain="sync", transparent_for=(), src_loc_at=0):
        if domain == "comb" or transparent_for:
            raise ValueError("BlockRam read ports are synchronous and not transparent "
                             f"(domain={domain!r}, transparent_for={transparent_for!r})")
        return super().read_port(domain=domain, src_loc_at=1 + src_loc_at)

    def elaborate(self, platform):
        if len(self.write_ports) != 1 or len(self.read_ports) > MAX_READ_PORTS:
            raise ValueError(f"a BlockRam has one write port and at most {MAX_READ_PORTS} "
                             f"read ports, not {len(self.write_ports)} and "
                             f"{len(self.read_ports)}")
        if platform is not None:
            return super().elaborate(platform)
        return self._poisoned()

    def _poisoned(self) -> Module:
        """The simulation model: a plain memory on the same data, every read port's word
        poisoned in the cycle after it collided."""
        m = Module()
        m.submodules.ram = ram = memory.Memory(self.data)
        (w,) = self.write_ports
        inner_w = ram.write_port(domain=w.domain, granularity=w.signature.granularity)
        m.d.comb += [inner_w.addr.eq(w.addr), inner_w.data.eq(w.data), inner_w.en.eq(w.en)]
        for port in self.read_ports:
            inner = ram.read_port(domain=port.domain)
            collides = Signal()
            hit = Signal()
            m.d.comb += [inner.addr.eq(port.addr), inner.en.eq(port.en),
                         collides.eq(w.en.any() & (w.addr == port.addr))]
            with m.If(port.en):
                m.d[port.domain] += hit.eq(collides)
            word = Value.cast(inner.data)
            m.d.comb += Value.cast(port.data).eq(Mux(hit, word ^ poison(len(word)), word))
        return m


class BlockRamFIFO(wiring.Component):
    """:class:`~amaranth.lib.fifo.SyncFIFOBuffered` on a :class:`BlockRam`: the same ports
    and the same cycle behaviour, without Yosys' read-first logic around the storage.

    The storage is read only where its head was written a cycle or more before (a read
    needs a stored word; a write goes to the free slot after the last), so a read never
    meets the write of its own word, and the block RAM's read register is the FIFO's output
    register, as in Amaranth's FIFO. Golden model: ``SyncFIFOBuffered`` itself, cycle by
    cycle (``tests/test_hdl_ram.py``).

    Parameters
    ----------
    width : int
        Bits of a word.
    depth : int
        Words held (at least 2: one in the output register, the rest in the block RAM).

    Members
    -------
    w_data, w_en, w_rdy, r_data, r_en, r_rdy, level :
        As :class:`~amaranth.lib.fifo.SyncFIFOBuffered`'s (``level``: words held).
    """

    def __init__(self, *, width: int, depth: int):
        if not isinstance(width, int) or width < 1:
            raise TypeError(f"width must be a positive integer, not {width!r}")
        if not isinstance(depth, int) or depth < 2:
            raise ValueError(f"depth must be an integer of at least 2, not {depth!r}")
        self.width, self.depth = width, depth
        super().__init__({"w_data": In(width), "w_en": In(1), "w_rdy": Out(1),
                          "r_data": Out(width), "r_en": In(1), "r_rdy": Out(1),
                          "level": Out(range(depth + 1))})

    def elaborate(self, platform):
        m = Module()
        inner = self.depth - 1
        m.submodules.storage = storage = BlockRam(shape=self.width, depth=inner, init=[])
        wp, rp = storage.write_port(), storage.read_port()
        produce, consume = Signal(range(inner)), Signal(range(inner))
        held = Signal(range(inner + 1))             # words in the block RAM
        do_write = self.w_en & self.w_rdy
        do_read = (held != 0) & (~self.r_rdy | self.r_en)   # into the output register
        m.d.comb += [self.w_rdy.eq(held != inner), self.level.eq(held + self.r_rdy),
                     wp.addr.eq(produce), wp.data.eq(self.w_data), wp.en.eq(do_write),
                     rp.addr.eq(consume), rp.en.eq(do_read), self.r_data.eq(rp.data)]
        with m.If(do_write):
            m.d.sync += produce.eq(Mux(produce == inner - 1, 0, produce + 1))
        with m.If(do_read):
            m.d.sync += consume.eq(Mux(consume == inner - 1, 0, consume + 1))
        m.d.sync += held.eq(held + do_write - do_read)
        with m.If(do_read):
            m.d.sync += self.r_rdy.eq(1)
        with m.Elif(self.r_en):
            m.d.sync += self.r_rdy.eq(0)
        return m


class _Port:
    """A word read port of :class:`LaneBankedRam`: ``addr``, ``en`` (1: read; 0: hold the
    data) and ``data``."""

    def __init__(self, abits: int, width: int, name: str):
        self.addr = Signal(abits, name=f"{name}_addr")
        self.en = Signal(init=1, name=f"{name}_en")
        self.data = Signal(width, name=f"{name}_data")


class _LanesPort:
    """A lanes read port of :class:`LaneBankedRam`: ``rows`` (each bank's row), ``first``
    (the bank of lane 0), ``en`` (1: read; 0: hold the data) and ``data`` (``banks``
    words, lane l from bank ``(first + l) mod banks``). :meth:`at` drives ``rows`` and
    ``first`` for the words from one address; a caller that steps through memory can keep
    the rows in registers of its own instead, so no adder stands in front of the banks."""

    def __init__(self, row_bits: int, banks: int, width: int, name: str):
        self.bank_bits = banks.bit_length() - 1
        self.rows = [Signal(row_bits, name=f"{name}_row{b}") for b in range(banks)]
        self.first = Signal(self.bank_bits, name=f"{name}_first")
        self.en = Signal(init=1, name=f"{name}_en")
        self.data = [Signal(width, name=f"{name}_data{l}") for l in range(banks)]

    def at(self, addr):
        """Statements that read the ``banks`` words from word address ``addr`` (``q·B + s``:
        bank b reads row ``q + (b < s)``)."""
        return lanes_address(addr, len(self.rows), self.rows, self.first)


def lanes_address(addr, banks, rows, first):
    """``rows`` and ``first`` of the ``banks`` consecutive words from ``addr`` (statements)."""
    sb = banks.bit_length() - 1
    q, s = addr >> sb, addr[:sb]
    return [*(row.eq(q + (b < s)) for b, row in enumerate(rows)), first.eq(s)]


class _WritePort:
    """The write port of :class:`LaneBankedRam` (and of :func:`registered_write`):
    ``addr``, ``data``, ``en``."""

    def __init__(self, abits: int, width: int, name: str = "w"):
        self.addr = Signal(abits, name=f"{name}_addr")
        self.data = Signal(width, name=f"{name}_data")
        self.en = Signal(name=f"{name}_en")


def registered_write(m, port, *, name: str) -> _WritePort:
    """A write request (``addr``, ``data``, ``en``) that reaches a one-bit-enable write
    *port* a cycle later, through registers: what decides the write stays off the RAM's
    pins. The caller guarantees no read depends on a word in the cycle after its write."""
    assert len(port.en) == 1
    req = _WritePort(len(port.addr), len(port.data), name)
    m.d.sync += [port.addr.eq(req.addr), port.data.eq(req.data), port.en.eq(req.en)]
    return req


class LaneBankedRam(Elaboratable):
    """Words in ``banks`` interleaved :class:`BlockRam` banks (word ``w`` in bank
    ``w mod banks``, row ``w // banks``), with *lanes* read ports that read the ``banks``
    consecutive words from any address in one cycle, one word from each bank.

    A lanes port is one read port on every bank, where a plain :class:`BlockRam` would need
    a read port (a copy of the whole memory on the FPGA) per word. Every read port of either
    kind is a read port on every bank; the write goes to one bank::

        lanes port, addr a = q·B + s:  bank b reads row q + (b < s)
                                       lane l = bank (s + l) mod B, one cycle later

    Golden model: one memory of ``depth`` words; a word port reads ``mem[addr]``, a lanes
    port ``mem[(addr + l) mod depth]`` for lane ``l``, one cycle after ``en`` (``en`` low
    holds the data); reads are not transparent. A read that collides with the write is
    undefined, as in :class:`BlockRam` (in simulation: that word poisoned).

    Parameters
    ----------
    width : int
        Bits of a word.
    depth : int
        Words (a power of two, at least ``banks``).
    banks : int
        Banks, and the words a lanes port returns (a power of two).
    init : sequence of int
        Initial words.

    Members
    -------
    read_port() :
        A one-word read port (``addr``, ``en``, ``data``).
    lanes_port() :
        A lanes read port (``rows``, ``first``, ``en``, ``data``: a list of ``banks``
        words; its ``at(addr)`` drives ``rows`` and ``first`` from a word address).
    write_port() :
        The one write port (``addr``, ``data``, ``en``).
    """

    def __init__(self, *, width: int, depth: int, banks: int, init=()):
        if not isinstance(banks, int) or banks < 1 or banks & (banks - 1):
            raise ValueError(f"banks must be a power of two, not {banks!r}")
        if not isinstance(depth, int) or depth < banks or depth & (depth - 1):
            raise ValueError(f"depth must be a power of two of at least {banks}, not "
                             f"{depth!r}")
        if len(init) > depth:
            raise ValueError(f"init has {len(init)} words, the memory {depth}")
        self.width, self.depth, self.banks = width, depth, banks
        self.abits, self.bank_bits = depth.bit_length() - 1, banks.bit_length() - 1
        self._init = list(init)
        self._reads: list[_Port] = []
        self._write = None

    def read_port(self) -> _Port:
        port = _Port(self.abits, self.width, f"rd{len(self._reads)}")
        self._reads.append(port)
        return port

    def lanes_port(self) -> _LanesPort:
        port = _LanesPort(self.abits - self.bank_bits, self.banks, self.width,
                          f"rd{len(self._reads)}")
        self._reads.append(port)
        return port

    def write_port(self) -> _WritePort:
        if self._write is not None:
            raise ValueError("a LaneBankedRam has one write port")
        self._write = _WritePort(self.abits, self.width)
        return self._write

    def elaborate(self, platform):
        m = Module()
        B, SB = self.banks, self.bank_bits
        rows = self.depth // B
        init = self._init + [0] * (self.depth - len(self._init))
        banks = []
        for b in range(B):
            m.submodules[f"bank{b}"] = bank = BlockRam(shape=self.width, depth=rows,
                                                      init=init[b::B])
            banks.append(bank)
        w = self._write or _WritePort(self.abits, self.width)
        for b, bank in enumerate(banks):
            wp = bank.write_port()
            m.d.comb += [wp.addr.eq(w.addr >> SB), wp.data.eq(w.data),
                         wp.en.eq(w.en & (w.addr[:SB] == b))]
        for port in self._reads:
            self._read(m, port, [bank.read_port() for bank in banks])
        return m

    def _read(self, m, port, rps):
        SB = self.bank_bits
        lanes = isinstance(port, _LanesPort)
        if lanes:
            rows, s = port.rows, port.first
        else:
            rows, s = [port.addr >> SB] * len(rps), port.addr[:SB]
        s_q = Signal(SB, name=f"{rps[0].addr.name}_first")   # lane 0's bank, as read
        with m.If(port.en):
            m.d.sync += s_q.eq(s)
        for row, rp in zip(rows, rps):
            m.d.comb += [rp.addr.eq(row), rp.en.eq(port.en)]
        words = Array(rp.data for rp in rps)
        if lanes:
            for l, lane in enumerate(port.data):
                m.d.comb += lane.eq(words[(s_q + l)[:SB]])
        else:
            m.d.comb += port.data.eq(words[s_q])
