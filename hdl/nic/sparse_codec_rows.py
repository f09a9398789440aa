"""The sparse engine's codec-message rows (SEND_BM, GSEND_BM, RECV_BM, GRECV_BM): the
encoder and decoder of :mod:`treenic.hdl.sparse.codec` between the row sequencer and the
links (see :mod:`.sparse_engine`; built only with ``codec=True``).

A codec message on the link: the ``SUB_HEAD`` flit as for pair messages, then the message
words of ``treenic.sparse.codec`` (a header word -- count L, format bit -- then L
(index, value) word pairs or the flow's ceil(C/32) bitmap words and the L values; the
smaller of the two, the golden's decision rule, made by the encoder) two to a ``SUB_BODY``
flit (first word in bits 0..31; an odd last word leaves bits 32..63 zero), then
``MSG_TAIL`` carrying the number of body flits. Indices in the words are flow-relative.
"""
from __future__ import annotations

from amaranth import Cat, Mux, Signal

from ..link.flit import FlitType
from .sparse_sequencer import malformed, pair_fits, write_count
from treenic.schedule.sparse_table import SparseOp


def codec_states(m, c, j, fin_fire, n_pairs, seen, bad, slot_base):
    _encode_states(m, c, j, fin_fire, n_pairs)
    _decode_states(m, c, n_pairs, seen, bad, slot_base)


def _encode_states(m, c, j, fin_fire, n_pairs):
    """GS_ENC feeds a final slot to the encoder (GSEND_BM; SEND_BM: the slot its selection
    filled); ENC_OUT / ENC_LAST pack its words two to a flit; n_pairs counts the body
    flits, which TAIL sends."""
    row, enc = c.row, c.enc
    low = Signal(32)
    have_low = Signal()
    with m.State("GS_ENC"):
        m.d.comb += [enc.i.valid.eq(1), c.fin_walk.eq(1)]     # see sequencer's fin_walk
        with m.If(j.at["count"]):
            m.d.comb += [enc.i.payload.none.eq(1), enc.i.payload.last.eq(1)]
            with m.If(enc.i.ready):
                m.d.sync += n_pairs.eq(0)
                m.next = "ENC_OUT"
        with m.Else():
            m.d.comb += [enc.i.payload.index.eq(c.fin_r.data[:32] - row.lo),
                         enc.i.payload.value.eq(c.fin_r.data[32:]), fin_fire.eq(enc.i.ready)]
            with m.If(enc.i.ready):
                j.step(m)
    with m.State("ENC_OUT"):
        word, last = enc.o.payload.word, enc.o.payload.last
        with m.If(~have_low):
            m.d.comb += enc.o.ready.eq(1)
            with m.If(enc.o.valid):
                m.d.sync += [low.eq(word), have_low.eq(1)]
                with m.If(last):
                    m.next = "ENC_LAST"
        with m.Else():
            m.d.comb += [c.tx_req.eq(enc.o.valid), c.tx_type.eq(FlitType.SUB_BODY),
                         c.tx_data.eq(Cat(low, word)), enc.o.ready.eq(c.tx_fire)]
            with m.If(c.tx_fire):
                m.d.sync += [have_low.eq(0), n_pairs.eq(n_pairs + 1)]
                with m.If(last):
                    m.next = "TAIL"
    with m.State("TAIL"):
        m.d.comb += [c.tx_req.eq(1), c.tx_type.eq(FlitType.MSG_TAIL), c.tx_data.eq(n_pairs)]
        with m.If(c.tx_fire):
            m.next = "NEXT"
    with m.State("ENC_LAST"):
        m.d.comb += [c.tx_req.eq(1), c.tx_type.eq(FlitType.SUB_BODY), c.tx_data.eq(low)]
        with m.If(c.tx_fire):
            m.d.sync += [have_low.eq(0), n_pairs.eq(n_pairs + 1)]
            m.next = "TAIL"


def _decode_states(m, c, n_pairs, seen, bad, slot_base):
    """RX_DEC_INIT resets the decoder; RX_DEC unpacks body flits into message words (the
    header word says how many follow, so a pad word is skipped) while the decoder's pairs
    go to the scatter adder (RECV_BM) or the final slot (GRECV_BM); after the tail,
    RX_DEC_END waits for the decoder's last pair. A message that ends early, a decoder
    error, a pair outside the flow, beyond the budget or not ascending, extra flits, or a
    tail count that disagrees are counted in ``malformed`` and drop the message whole (the
    sequencer's undo log restores what its decoded pairs added; golden:
    ``treenic.sparse.codec.receive_words``)."""
    e, row, dec, rx = c.e, c.row, c.dec, c.rx_flit
    half, started, done = Signal(), Signal(), Signal()
    left = Signal(range(2 * e.max_flow + 4))
    reduce = c.op == SparseOp.RECV_BM
    with m.State("RX_DEC_INIT"):
        m.d.comb += c.dec_reset.eq(1)
        m.d.sync += [half.eq(0), started.eq(0), done.eq(0)]
        m.next = "RX_DEC"
    with m.State("RX_DEC"):
        m.d.comb += c.main_uses.eq(1)     # the message body: the units' pairs wait
        _decoded_pairs(m, c, n_pairs, slot_base, reduce, done)
        word = Mux(half, rx.data[32:], rx.data[:32])
        count = word[:31]
        total = 1 + Mux(word[31], ((row.n + 31) >> 5) + count, count << 1)
        after = Mux(started, left - 1, total - 1)
        body = c.rx_valid & (rx.type == FlitType.SUB_BODY)
        with m.If(body & ~bad & ~(started & (left == 0))):
            m.d.comb += [dec.i.valid.eq(1), dec.i.payload.word.eq(word)]
            with m.If(dec.i.ready):
                m.d.sync += [left.eq(after), started.eq(1), half.eq(~half & (after != 0))]
                with m.If(half | (after == 0)):
                    m.d.comb += c.rx_pop.eq(1)
                    m.d.sync += seen.eq(seen + 1)
        with m.Elif(body):                     # dropped: a bad head's, or past the words
            m.d.comb += c.rx_pop.eq(1)
            m.d.sync += seen.eq(seen + 1)
            with m.If(~bad):
                malformed(m, c)
        with m.Elif(c.rx_valid & (rx.type == FlitType.MSG_TAIL)):
            m.d.comb += c.rx_pop.eq(1)
            with m.If(rx.data[:32] != seen):
                malformed(m, c)
            m.next = "RX_DEC_END"
        with m.Elif(c.rx_valid):
            m.d.comb += c.rx_pop.eq(1)
            malformed(m, c)
    with m.State("RX_DEC_END"):
        m.d.comb += c.main_uses.eq(1)     # the message body: the units' pairs wait
        _decoded_pairs(m, c, n_pairs, slot_base, reduce, done)
        ended = done | bad | ~started | (left != 0) | dec.error
        with m.If(ended):
            with m.If(~done & ~bad):
                malformed(m, c)
            with m.If(~reduce):
                write_count(m, c, n_pairs)
            m.d.comb += c.dec_reset.eq(~done)
            m.next = "DRAIN"


def _decoded_pairs(m, c, n_pairs, slot_base, reduce, done):
    """The decoder's pairs (called in RX_DEC and RX_DEC_END: the decoder only has output
    while such a row runs)."""
    row, o = c.row, c.dec.o
    index = (o.payload.index + row.lo)[:32]
    fits = (o.payload.index < row.n) & pair_fits(c, n_pairs, index > c.prev_index) & ~o.payload.none
    with m.If(o.valid):
        with m.If(fits & reduce):
            m.d.comb += [c.sc_valid.eq(1), c.sc_index.eq(index), c.sc_value.eq(o.payload.value),
                         c.sc_log.eq(1), o.ready.eq(c.sc_ready)]
        with m.Else():
            m.d.comb += [o.ready.eq(1), c.fin_w.addr.eq(slot_base + n_pairs),
                         c.fin_w.data.eq(Cat(index, o.payload.value)),
                         c.fin_w.en.eq(fits & ~reduce)]
        with m.If(o.ready):
            with m.If(fits):
                m.d.sync += [n_pairs.eq(n_pairs + 1), c.prev_index.eq(index)]
            with m.Elif(~o.payload.none):
                malformed(m, c)
            with m.If(o.payload.last):
                m.d.sync += done.eq(1)
