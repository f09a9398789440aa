"""Amaranth-simulator tests of one SparseEngine: a ROOT selection equals the golden top-k
(the final pairs, and the residual with the selection removed); a RECV adds a child's
pairs through the scatter adder; malformed sparse messages are counted and their pairs
dropped."""
import numpy as np

from treenic.hdl.link.flit import FlitFormat, FlitType, Op
from treenic.hdl.nic.sparse_engine import SparseEngine
from treenic.hdl.nic.sparse_fabric import (clear_word, decode_dump, dump_word, load_words,
                                           start_word)
from treenic.hdl.sparse.simdrive import run_with_link, send_words
from treenic.schedule.sparse_table import SparseOp, SparseProgram, pack_row
from treenic.sparse.select import topk

N = 32
FMT = FlitFormat()


def _engine(codec=False):
    return SparseEngine(ports=1, depth=N, lanes=2, max_flow=N, chunks=1, slot=8, rows=8,
                        rx_depth=32, scan_bins=16, fmt=FMT, codec=codec)


def _run(rows, grads, flits=(), clear=False, codec=False):
    """Load, feed ``flits`` on rx[0], run, dump; returns (residual, result, malformed)."""
    eng = _engine(codec)
    prog = SparseProgram("ring:2", N, [rows], 1, N, 8, 32, 1)
    got = {}

    async def host(ctx):
        got["words"], got["bad"] = await _run_and_dump(
            ctx, eng, load_words(prog, 0, grads), ([clear_word(N)] if clear else []) +
            [dump_word(N)])

    run_with_link(eng, host, flits)
    resid, out = decode_dump(got["words"], N)
    return resid, out, got["bad"]


async def _run_and_dump(ctx, eng, load, dump):
    """Host words ``load``, START, wait for the run, then ``dump`` (ending with a DUMP):
    (the dump's words, ``malformed``)."""
    await send_words(ctx, eng.host_i, load + [start_word()])
    await ctx.tick().until(eng.busy == 1)
    await ctx.tick().until(eng.busy == 0)
    await send_words(ctx, eng.host_i, dump)
    ctx.set(eng.host_o.ready, 1)
    words = []
    while True:
        _, _, v, w = await ctx.tick().sample(eng.host_o.valid, eng.host_o.payload.as_value())
        if v and w >> 65 & 1:
            break
        if v:
            words.append(w)
    return words, ctx.get(eng.malformed)


def _grads(seed):
    g = np.random.default_rng(seed).standard_normal(N).astype(np.float32)
    g[::5] = 0
    return g


def test_root_selection_is_the_golden_topk():
    g = _grads(1)
    resid, out, bad = _run([pack_row(op=SparseOp.ROOT, lo=0, n=N, k=6),
                            pack_row(op=SparseOp.END)], g)
    idx = topk(g, 6)
    want_out = np.zeros(N, np.float32)
    want_out[idx] = g[idx]
    want_res = g.copy()
    want_res[idx] = 0
    assert np.array_equal(out.view(np.uint32), want_out.view(np.uint32))
    assert np.array_equal(resid.view(np.uint32), want_res.view(np.uint32))
    assert bad == 0


def _message(step, chunk, pairs, *, count=None, op=Op.SPARSE):
    head = FMT.pack_sub_head(flow=chunk, op=int(op), step=step, length=len(pairs))
    out = [FMT.make_flit(FlitType.SUB_HEAD, 0, head)]
    for i, v in pairs:
        out.append(FMT.make_flit(FlitType.SUB_BODY, 0,
                                 int(i) | int(np.float32(v).view(np.uint32)) << 32))
    out.append(FMT.make_flit(FlitType.MSG_TAIL, 0, len(pairs) if count is None else count))
    return out


def test_recv_adds_pairs_and_malformed_messages_are_dropped():
    g = _grads(2)
    rows = [pack_row(op=SparseOp.RECV, step=1, lo=0, n=16, k=4),
            pack_row(op=SparseOp.RECV, step=2, lo=0, n=16, k=4),
            pack_row(op=SparseOp.END)]
    good = [(1, 0.5), (3, -2.0), (9, 1.25)]
    flits = (_message(1, 0, good) +
             _message(2, 0, [(2, 7.0), (20, 1.0), (4, 3.0)], count=3))   # 20: outside 0..15
    resid, out, bad = _run(rows, g, flits)
    want = g.copy()
    for i, v in good + [(2, 7.0), (4, 3.0)]:
        want[i] = np.float32(want[i] + np.float32(v))
    assert np.array_equal(resid.view(np.uint32), want.view(np.uint32))
    assert bad == 1 and not out.any()


def test_wrong_head_drops_the_message():
    g = _grads(3)
    rows = [pack_row(op=SparseOp.RECV, step=1, lo=0, n=16, k=4), pack_row(op=SparseOp.END)]
    resid, _, bad = _run(rows, g, _message(5, 0, [(1, 1.0), (2, 2.0)]))   # wrong step
    assert np.array_equal(resid.view(np.uint32), g.view(np.uint32))
    assert bad == 3                              # the head and its two pairs


def test_clear_zeroes_the_residual():
    g = _grads(4)
    g[3] = np.float32(-0.0)
    resid, out, bad = _run([pack_row(op=SparseOp.ROOT, lo=0, n=N, k=3),
                            pack_row(op=SparseOp.END)], g, clear=True)
    assert np.array_equal(resid.view(np.uint32), np.zeros(N, np.uint32))   # all +0
    assert np.count_nonzero(out) == 3 and bad == 0


def _codec_message(step, pairs, chunk, *, words_kept=None):
    """A codec message (``treenic.sparse.codec.encode_message``, two words a flit); with
    ``words_kept`` the body is cut after that many words (the tail counts what is sent)."""
    from treenic.sparse.codec import encode_message
    idx = np.array([i for i, _ in pairs], np.int64)
    words = [int(w) for w in encode_message(idx, np.array([v for _, v in pairs], np.float32),
                                            chunk)][:words_kept]
    head = FMT.pack_sub_head(flow=0, op=int(Op.SPARSE), step=step, length=len(pairs))
    body = [FMT.make_flit(FlitType.SUB_BODY, 0, words[i] | (words[i + 1] if i + 1 < len(words)
                                                            else 0) << 32)
            for i in range(0, len(words), 2)]
    return ([FMT.make_flit(FlitType.SUB_HEAD, 0, head)] + body +
            [FMT.make_flit(FlitType.MSG_TAIL, 0, len(body))])


def test_codec_recv_bitmap_and_pairs_and_a_truncated_message():
    """RECV_BM decodes the golden codec's bitmap and pair messages into the scatter adder;
    a message cut short is counted, its decoded pairs stay, and the next message decodes
    (the decoder is reset at every message)."""
    from treenic.sparse.codec import FORMAT_BITMAP, message_format
    g = _grads(5)
    rows = [pack_row(op=SparseOp.RECV_BM, step=s, lo=0, n=N, k=4) for s in (1, 2, 3)]
    bitmap = [(1, 0.5), (3, -2.0), (9, 1.25), (30, 4.0)]     # 4 pairs > 1 bitmap word
    pairs = [(7, 3.0)]                                        # 1 pair: pair format
    assert message_format(4, N) == FORMAT_BITMAP != message_format(1, N)
    cut = [(2, 1.0), (5, 2.0), (6, 8.0)]
    flits = (_codec_message(1, bitmap, N) + _codec_message(2, cut, N, words_kept=3) +
             _codec_message(3, pairs, N))
    resid, _, bad = _run(rows + [pack_row(op=SparseOp.END)], g, flits, codec=True)
    want = g.copy()
    for i, v in bitmap + cut[:1] + pairs:                     # the cut message's first pair
        want[i] = np.float32(want[i] + np.float32(v))
    assert np.array_equal(resid.view(np.uint32), want.view(np.uint32))
    assert bad == 1


# ---- the hash placer in the engine (flow_assignment="hash") -------------------------------

HASH_N, HASH_FLOWS, HASH_SEED = 48, 3, 21


def _hash_program():
    """One node rooting three hash flows (a non-power-of-two flow count: the hash unit's
    modulo path), top-2 of each."""
    from treenic.sparse.multitree_sparse import hash_flows
    perm, off = hash_flows(HASH_N, HASH_FLOWS, HASH_SEED)
    rows = [pack_row(op=SparseOp.ROOT, chunk=c, lo=int(off[c]), n=int(off[c + 1] - off[c]), k=2)
            for c in range(HASH_FLOWS)] + [pack_row(op=SparseOp.END)]
    return SparseProgram("ring:2", HASH_N, [rows], HASH_FLOWS, int(np.diff(off).max()), 2, 8, 1,
                         perm=perm.tolist(), hash_seed=HASH_SEED), perm, off


def _hash_run(words):
    """Host words (program, HASH, GRADs) into a hash-flow engine, START, DUMP: (dump
    words, malformed)."""
    prog, _, _ = _hash_program()
    eng = SparseEngine(ports=1, depth=64, lanes=2, max_flow=prog.max_flow, chunks=HASH_FLOWS,
                       slot=2, rows=8, rx_depth=8, fmt=FMT, hash_elements=HASH_N)
    got = {}

    async def host(ctx):
        got["words"], got["bad"] = await _run_and_dump(ctx, eng, words, [dump_word(HASH_N)])

    run_with_link(eng, host, ())
    return got["words"], got["bad"]


def test_hash_engine_places_element_order_and_labels_the_dump():
    """The host sends element order (no permutation); every flow's top-2 is the golden's
    selection in the permuted space, and the dump's words carry element indices."""
    from treenic.hdl.nic.sparse_fabric import decode_program_dump
    prog, perm, off = _hash_program()
    g = np.random.default_rng(4).standard_normal(HASH_N).astype(np.float32)
    words = load_words(prog, 0, g)
    assert [w >> 3 & 0xFFFFFF for w in words[-HASH_N:]] == list(range(HASH_N))
    dump, bad = _hash_run(words)
    assert bad == 0
    resid, out = decode_program_dump(dump, prog)
    part = g[perm]
    want_out, want_res = np.zeros(HASH_N, np.float32), g.copy()
    for c in range(HASH_FLOWS):
        idx = perm[topk(part[off[c]:off[c + 1]], 2) + off[c]]
        want_out[idx], want_res[idx] = g[idx], 0
    assert np.array_equal(out.view(np.uint32), want_out.view(np.uint32))
    assert np.array_equal(resid.view(np.uint32), want_res.view(np.uint32))
    labels = [w & 0xFFFFFFFF for w in dump[:HASH_N]]
    assert labels == perm.tolist()          # buffer order, each word naming its element


def test_hash_engine_counts_every_dropped_grad_word():
    """A sweep out of order (two words swapped) and a HASH word with the wrong seed: every
    word the placer drops is counted in ``malformed``, as many as its golden drops."""
    from treenic.hdl.nic.sparse_engine import HostKind
    from treenic.hdl.nic.sparse_place import place_golden
    prog, _, off = _hash_program()
    g = np.random.default_rng(5).standard_normal(HASH_N).astype(np.float32)
    words = load_words(prog, 0, g)
    head, grads = words[:-HASH_N], words[-HASH_N:]
    swapped = grads[:10] + [grads[11], grads[10]] + grads[12:]
    pairs = [(w >> 3 & 0xFFFFFF, 0) for w in swapped]
    table = (off[:-1], np.diff(off))
    want = place_golden(pairs, elements=HASH_N, flows=HASH_FLOWS, seed=HASH_SEED)[2]
    assert want == HASH_N - 11 and _hash_run(head + swapped)[1] == want
    wrong = [w if w & 7 != HostKind.HASH else w ^ (1 << 27) for w in head]   # seed 21 -> 20
    pairs = [(i, 0) for i in range(HASH_N)]
    want = place_golden(pairs, elements=HASH_N, flows=HASH_FLOWS, seed=HASH_SEED ^ 1,
                        table=table)[2]
    assert want > 0 and _hash_run(wrong + grads)[1] == want
