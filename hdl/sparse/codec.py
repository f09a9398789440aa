"""Sparse message codec: encoder and decoder stream components.

Format and decision rule: ``treenic.sparse.codec`` (golden): a header word (count L in bits
0..30, format in bit 31), then either L (index, value) word pairs or ceil(C/32) bitmap words
(LSB first) followed by the L values; bitmap iff ``ceil(C/32) < L``.

``SparseEncoder``: pairs in (chunk-relative index, value; ascending; ``last`` on the final
pair, or a ``none`` beat closing an empty message), message words out. It must know L before
the header, so it collects the message: indices and values into ``lib.memory`` buffers and
the bitmap word by word (ascending indices fill one bitmap word at a time in a register),
then emits one word per cycle. The bitmap buffer is cleared as it is emitted (bitmap format)
or word by word behind the emitted indices (pair format), so no clearing pass is needed.
Cycles per message: L (collect) + 2 + message words.

``SparseDecoder``: message words in, pairs out (same pair layout; ``last`` on the final pair,
a ``none``+``last`` beat for an empty message). Pair format: one pair per two words.
Bitmap format: the bitmap is stored, then each value word takes the next set bit (a
priority encoder); an all-zero bitmap word costs 2 cycles. ``chunk`` (C) is configuration
on both sides. Malformed input (count above C, bitmap running out of set bits) sets the
sticky ``error`` flag.
"""
from amaranth import Module, Mux, Signal
from amaranth.lib import data, enum, memory, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["SparseEncoder", "SparseDecoder", "PAIR", "WORD"]

PAIR = data.StructLayout({"index": 32, "value": 32, "last": 1, "none": 1})
WORD = data.StructLayout({"word": 32, "last": 1})


def _check(max_chunk):
    if not isinstance(max_chunk, int) or not 32 <= max_chunk <= 1 << 20:
        raise ValueError(f"max_chunk must be an integer in 32..2**20, got {max_chunk!r}")


class _Src(enum.Enum, shape=2):
    HEADER = 0
    INDEX = 1
    VALUE = 2
    BITMAP = 3


class SparseEncoder(wiring.Component):
    """Pairs -> sparse message words (pairs or bitmap + values, whichever is smaller).

    Parameters
    ----------
    max_chunk : int
        Largest chunk C (sizes the index/value/bitmap buffers).

    Members
    -------
    i : In(stream.Signature(PAIR))
    o : Out(stream.Signature(WORD))
    chunk : In(range(max_chunk + 1))
        C of the current message (configuration, held while busy).
    error : Out(1)
        Sticky: a pair out of range or not ascending was dropped.
    """

    def __init__(self, *, max_chunk: int = 4096):
        _check(max_chunk)
        self.max_chunk = max_chunk
        super().__init__({"i": In(stream.Signature(PAIR)), "o": Out(stream.Signature(WORD)),
                          "chunk": In(range(max_chunk + 1)), "error": Out(1)})

    def elaborate(self, platform):
        m = Module()
        C, IB = self.max_chunk, (self.max_chunk - 1).bit_length()
        m.submodules.idx_mem = idx_mem = memory.Memory(shape=IB, depth=C, init=[])
        m.submodules.val_mem = val_mem = memory.Memory(shape=32, depth=C, init=[])
        m.submodules.bm_mem = bm_mem = memory.Memory(shape=32, depth=-(-C // 32), init=[])
        idx_w, val_w, bm_w = idx_mem.write_port(), val_mem.write_port(), bm_mem.write_port()
        idx_r, val_r, bm_r = idx_mem.read_port(), val_mem.read_port(), bm_mem.read_port()
        count = Signal(range(C + 1))
        cur_w, cur_bits, have = Signal(IB), Signal(32), Signal()
        fmt, nwords = Signal(), Signal(range(C // 32 + 2))
        pos, total = Signal(range(2 * C + 2)), Signal(range(2 * C + 2))
        phase = Signal(range(3))                     # 0 collect, 1 flush/decide, 2 emit
        src, last_word, header = Signal(_Src), Signal(), Signal(32)
        advance = ~self.o.valid | self.o.ready
        for rp in (idx_r, val_r, bm_r):
            m.d.comb += rp.en.eq(advance)
        with m.If(advance):
            m.d.sync += self.o.valid.eq(0)
        with m.Switch(phase):
            with m.Case(0):
                self._collect(m, idx_w, val_w, bm_w, count, cur_w, cur_bits, have, phase)
            with m.Case(1):
                with m.If(have):
                    m.d.comb += [bm_w.addr.eq(cur_w), bm_w.data.eq(cur_bits), bm_w.en.eq(1)]
                nw = (self.chunk + 31) >> 5
                bitmap = nw < count
                m.d.sync += [fmt.eq(bitmap), nwords.eq(nw), pos.eq(0), phase.eq(2),
                             header.eq(count | (bitmap << 31)),
                             total.eq(1 + Mux(bitmap, nw + count, 2 * count))]
            with m.Case(2):
                with m.If(advance):
                    self._generate(m, idx_r, val_r, bm_r, bm_w, fmt, nwords, pos, total, src,
                                   last_word)
                    with m.If(pos == total - 1):
                        m.d.sync += [phase.eq(0), count.eq(0), have.eq(0)]
        # pair format: clear the bitmap word of every index shown (it was set while collecting)
        with m.If(self.o.valid & (src == _Src.INDEX) & ~fmt):
            m.d.comb += [bm_w.addr.eq(idx_r.data[5:]), bm_w.data.eq(0), bm_w.en.eq(1)]
        with m.Switch(src):
            with m.Case(_Src.HEADER):
                m.d.comb += self.o.payload.word.eq(header)
            with m.Case(_Src.INDEX):
                m.d.comb += self.o.payload.word.eq(idx_r.data)
            with m.Case(_Src.VALUE):
                m.d.comb += self.o.payload.word.eq(val_r.data)
            with m.Case(_Src.BITMAP):
                m.d.comb += self.o.payload.word.eq(bm_r.data)
        m.d.comb += self.o.payload.last.eq(last_word)
        return m

    def _collect(self, m, idx_w, val_w, bm_w, count, cur_w, cur_bits, have, phase):
        p = self.i.payload
        m.d.comb += self.i.ready.eq(1)
        word, bit = p.index[5:], 1 << p.index[:5]
        ok = (p.index < self.chunk) & (~have | (p.index[5:] > cur_w) |
                                        ((p.index[5:] == cur_w) & ((cur_bits >> p.index[:5]) == 0)))
        with m.If(self.i.valid):
            with m.If(~p.none & ok):
                m.d.comb += [idx_w.addr.eq(count), idx_w.data.eq(p.index), idx_w.en.eq(1),
                             val_w.addr.eq(count), val_w.data.eq(p.value), val_w.en.eq(1)]
                m.d.sync += [count.eq(count + 1), cur_w.eq(word), have.eq(1)]
                with m.If(have & (word != cur_w)):
                    m.d.comb += [bm_w.addr.eq(cur_w), bm_w.data.eq(cur_bits), bm_w.en.eq(1)]
                    m.d.sync += cur_bits.eq(bit)
                with m.Else():
                    m.d.sync += cur_bits.eq(Mux(have, cur_bits | bit, bit))
            with m.If(~p.none & ~ok):
                m.d.sync += self.error.eq(1)
            with m.If(p.last):
                m.d.sync += phase.eq(1)

    def _generate(self, m, idx_r, val_r, bm_r, bm_w, fmt, nwords, pos, total, src, last_word):
        """The word shown next: header, then index/value alternately or bitmap then values;
        the memory read issued now is on the read port's output next cycle."""
        k = pos - 1
        m.d.sync += [self.o.valid.eq(1), last_word.eq(pos == total - 1), pos.eq(pos + 1)]
        with m.If(pos == 0):
            m.d.sync += src.eq(_Src.HEADER)
        with m.Elif(~fmt):
            m.d.comb += [idx_r.addr.eq(k >> 1), val_r.addr.eq(k >> 1)]
            m.d.sync += src.eq(Mux(k[0], _Src.VALUE, _Src.INDEX))
        with m.Elif(k < nwords):
            m.d.comb += [bm_r.addr.eq(k), bm_w.addr.eq(k), bm_w.data.eq(0), bm_w.en.eq(1)]
            m.d.sync += src.eq(_Src.BITMAP)
        with m.Else():
            m.d.comb += val_r.addr.eq(k - nwords)
            m.d.sync += src.eq(_Src.VALUE)


class _Dec(enum.Enum, shape=3):
    HEADER = 0
    PAIR_INDEX = 1
    PAIR_VALUE = 2
    BITMAP = 3
    LOAD = 4
    LOADED = 5
    VALUES = 6


class SparseDecoder(wiring.Component):
    """Sparse message words -> ascending (index, value) pairs.

    Parameters
    ----------
    max_chunk : int
        Largest chunk C (sizes the bitmap buffer).

    Members
    -------
    i : In(stream.Signature(WORD))
    o : Out(stream.Signature(PAIR))
    chunk : In(range(max_chunk + 1))
    error : Out(1)
        Sticky: malformed message (count above C, or fewer set bits than values).
    """

    def __init__(self, *, max_chunk: int = 4096):
        _check(max_chunk)
        self.max_chunk = max_chunk
        super().__init__({"i": In(stream.Signature(WORD)), "o": Out(stream.Signature(PAIR)),
                          "chunk": In(range(max_chunk + 1)), "error": Out(1)})

    def elaborate(self, platform):
        m = Module()
        C = self.max_chunk
        m.submodules.bm_mem = bm_mem = memory.Memory(shape=32, depth=-(-C // 32), init=[])
        bm_w, bm_r = bm_mem.write_port(), bm_mem.read_port()
        phase = Signal(_Dec)
        count, n = Signal(range(C + 1)), Signal(range(C + 1))
        w, cur_bits, held_index = Signal(range(C // 32 + 2)), Signal(32), Signal(32)
        nw = (self.chunk + 31) >> 5
        word = self.i.payload.word
        advance = ~self.o.valid | self.o.ready
        take = self.i.valid & self.i.ready
        out = self.o.payload
        lowest = Signal(5)
        for b in reversed(range(32)):
            with m.If(cur_bits[b]):
                m.d.comb += lowest.eq(b)
        m.d.comb += bm_r.addr.eq(w)
        with m.If(advance):
            m.d.sync += self.o.valid.eq(0)

        def emit(index, value, none=0):
            m.d.sync += [self.o.valid.eq(1), out.index.eq(index), out.value.eq(value),
                         out.none.eq(none), out.last.eq(none | (n == count - 1)), n.eq(n + 1)]
            with m.If(none | (n == count - 1)):
                m.d.sync += phase.eq(_Dec.HEADER)

        with m.Switch(phase):
            with m.Case(_Dec.HEADER):
                m.d.comb += self.i.ready.eq(advance)
                with m.If(take):
                    m.d.sync += [count.eq(word[:31]), n.eq(0), w.eq(0)]
                    with m.If(word[:31] > self.chunk):
                        m.d.sync += self.error.eq(1)
                    with m.Elif(word[:31] == 0):
                        emit(0, 0, none=1)
                    with m.Else():
                        m.d.sync += phase.eq(Mux(word[31], _Dec.BITMAP, _Dec.PAIR_INDEX))
            with m.Case(_Dec.PAIR_INDEX):
                m.d.comb += self.i.ready.eq(1)
                with m.If(take):
                    m.d.sync += [held_index.eq(word), phase.eq(_Dec.PAIR_VALUE)]
            with m.Case(_Dec.PAIR_VALUE):
                m.d.comb += self.i.ready.eq(advance)
                with m.If(take):
                    m.d.sync += phase.eq(_Dec.PAIR_INDEX)
                    emit(held_index, word)
            with m.Case(_Dec.BITMAP):
                m.d.comb += self.i.ready.eq(1)
                with m.If(take):
                    m.d.comb += [bm_w.addr.eq(w), bm_w.data.eq(word), bm_w.en.eq(1)]
                    m.d.sync += w.eq(w + 1)
                    with m.If(w == nw - 1):
                        m.d.sync += [w.eq(0), phase.eq(_Dec.LOAD)]
            with m.Case(_Dec.LOAD):
                m.d.sync += phase.eq(_Dec.LOADED)       # bm_r.data = bitmap[w] next cycle
            with m.Case(_Dec.LOADED):
                m.d.sync += [cur_bits.eq(bm_r.data), phase.eq(_Dec.VALUES)]
            with m.Case(_Dec.VALUES):
                with m.If(cur_bits == 0):
                    m.d.sync += [w.eq(w + 1), phase.eq(_Dec.LOAD)]
                    with m.If(w + 1 >= nw):
                        m.d.sync += [self.error.eq(1), phase.eq(_Dec.HEADER)]
                with m.Else():
                    m.d.comb += self.i.ready.eq(advance)
                    with m.If(take):
                        m.d.sync += cur_bits.eq(cur_bits & (cur_bits - 1))
                        emit((w << 5) | lowest, word)
        return m
