"""Amaranth-simulator tests of one SparseEngine: a ROOT selection equals the golden top-k
(the final pairs, and the residual with the selection removed); a RECV adds a child's
pairs through the scatter adder; malformed sparse messages are counted and their pairs
dropped."""
import numpy as np
import pytest

from treenic.hdl.link.flit import FlitFormat, FlitType, Op
from treenic.hdl.nic.sparse_engine import SparseEngine
from treenic.hdl.nic.sparse_fabric import (clear_word, decode_dump, dump_word, load_words,
                                           start_word)
from treenic.hdl.sparse.simdrive import run_with_link, send_words
from treenic.schedule.sparse_table import SparseOp, SparseProgram, pack_row
from treenic.sparse.base import scatter_accumulate
from treenic.sparse.select import topk

N = 32
FMT = FlitFormat()


def _engine(codec=False, chunks=1, rows=8, rx_depth=32):
    return SparseEngine(ports=1, depth=N, lanes=2, max_flow=N, chunks=chunks, slot=8,
                        rows=rows, rx_depth=rx_depth, scan_bins=16, fmt=FMT, codec=codec)


def _run(rows, grads, flits=(), clear=False, codec=False, chunks=1, stall=0.0, seed=0):
    """Load, feed ``flits`` on rx[0] (idle cycles with probability ``stall``), run, dump;
    returns (residual, result, malformed)."""
    depth = max(32, len(flits))
    eng = _engine(codec, chunks, max(8, len(rows)), depth)
    prog = SparseProgram("ring:2", N, [rows], chunks, N, 8, depth, 1)
    got = {}

    async def host(ctx):
        got["words"], got["bad"] = await _run_and_dump(
            ctx, eng, load_words(prog, 0, grads), ([clear_word(N)] if clear else []) +
            [dump_word(N)])

    run_with_link(eng, host, flits, stall=stall, seed=seed)
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
    for i, v in good:               # the second message is dropped whole, (2, 7.0) undone
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


def _codec_message(step, pairs, chunk, *, words_kept=None, count=None):
    """A codec message (``treenic.sparse.codec.encode_message``, two words a flit); with
    ``words_kept`` the body is cut after that many words (the tail counts what is sent,
    or says ``count``)."""
    from treenic.sparse.codec import encode_message
    idx = np.array([i for i, _ in pairs], np.int64)
    words = [int(w) for w in encode_message(idx, np.array([v for _, v in pairs], np.float32),
                                            chunk)][:words_kept]
    head = FMT.pack_sub_head(flow=0, op=int(Op.SPARSE), step=step, length=len(pairs))
    body = [FMT.make_flit(FlitType.SUB_BODY, 0, words[i] | (words[i + 1] if i + 1 < len(words)
                                                            else 0) << 32)
            for i in range(0, len(words), 2)]
    return ([FMT.make_flit(FlitType.SUB_HEAD, 0, head)] + body +
            [FMT.make_flit(FlitType.MSG_TAIL, 0, len(body) if count is None else count)])


def test_codec_recv_bitmap_and_pairs_and_a_truncated_message():
    """RECV_BM decodes the golden codec's bitmap and pair messages into the scatter adder;
    a message cut short is counted and dropped whole (the pair it decoded is undone), and
    the next message decodes (the decoder is reset at every message)."""
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
    for i, v in bitmap + pairs:                               # not the cut message's first
        want[i] = np.float32(want[i] + np.float32(v))
    assert np.array_equal(resid.view(np.uint32), want.view(np.uint32))
    assert bad == 1


# ---- malformed messages are dropped whole (the undo log) -----------------------------------

PAIR_KINDS = ("good", "good", "tail", "outside", "unsorted", "budget", "stray", "head")
CODEC_KINDS = ("good", "good", "good", "cut", "cut", "tail", "stray", "budget")
STRAY = [t for t in FlitType if t not in (FlitType.SUB_BODY, FlitType.MSG_TAIL)]
K = 5


def _malformed_message(rng, kind, step, lo, n, codec):
    """(flits, pairs as sent, framing intact, malformed counts) of one message of ``kind``
    for a RECV(_BM) row (step, lo, n, k = K): the pairs go to the golden receive rule."""
    count = K + 1 if kind == "budget" else int(rng.integers(2, K + 1))
    idx = np.sort(rng.choice(np.arange(lo, lo + n), count, replace=False))
    pairs = [(int(i), float(v)) for i, v in zip(idx, rng.standard_normal(count))]
    at = int(rng.integers(0, count))
    if kind == "outside" and step // 2 % 2:
        pairs.insert(at, (lo + n + int(rng.integers(0, 4)) if lo == 0 else lo - 1, 1.5))
    elif kind == "outside":         # last, its low bits in the flow and above the rest
        pairs = [p for p in pairs if p[0] < lo + n - 1] + [(1 << 31 | lo + n - 1, 1.5)]
    if kind == "unsorted":
        pairs.insert(at + 1, (pairs[at][0], -2.5))
    tail = {"tail": count + 1 + int(rng.integers(0, 3))}.get(kind)
    if codec:
        rel = [(i - lo, v) for i, v in pairs]
        words = len(encode_words(rel, n))
        cut = int(rng.integers(0, words - 1)) if kind == "cut" else None
        flits = _codec_message(step, rel, n, words_kept=cut, count=tail)
        sent = encode_words(rel, n)[:cut]
    else:
        flits = _message(step + (kind == "head"), 0, pairs, count=tail)
        sent = None
    if kind == "stray":
        flits.insert(int(rng.integers(1, len(flits) - 1)),
                     FMT.make_flit(STRAY[int(rng.integers(0, len(STRAY)))], 0,
                                   int(rng.integers(0, 1 << 62))))
    counts = {"good": 0, "head": 1 + len(pairs)}.get(kind, 1)
    return flits, pairs, sent, kind not in ("tail", "stray", "head"), counts


def encode_words(rel_pairs, n):
    from treenic.sparse.codec import encode_message
    return [int(w) for w in encode_message(np.array([i for i, _ in rel_pairs], np.int64),
                                           np.array([v for _, v in rel_pairs], np.float32), n)]


def _golden_receive(buf, pairs, sent, intact, lo, n, codec):
    from treenic.sparse.base import receive_message
    from treenic.sparse.codec import receive_words
    if codec:
        return receive_words(buf, np.array(sent, np.uint32), lo=lo, n=n, k=K, intact=intact)
    return receive_message(buf, np.array([i for i, _ in pairs], np.int64),
                           np.array([v for _, v in pairs], np.float32), lo=lo, n=n, k=K,
                           intact=intact)


def _drop_case(codec, seed):
    """One engine's program of 8 RECV(_BM) rows (one message each, kinds in random order)
    and a ROOT selection of the flows: (rows, gradient, flits, golden part before the
    ROOT, malformed counts, the part the old half-applying rule would give)."""
    rng = np.random.default_rng(seed)
    g = _grads(seed)
    kinds = rng.permutation(CODEC_KINDS if codec else PAIR_KINDS)
    recv = SparseOp.RECV_BM if codec else SparseOp.RECV
    rows, flits, bad_want = [], [], 0
    want, half = g.copy(), g.copy()
    for step, kind in enumerate(kinds, 1):
        lo, n = (0, N) if codec else (8 * (step % 3), 16)
        rows.append(pack_row(op=recv, step=step, lo=lo, n=n, k=K))
        f, pairs, sent, intact, counts = _malformed_message(rng, kind, step, lo, n, codec)
        flits += f
        bad_want += counts
        want, taken = _golden_receive(want, pairs, sent, intact, lo, n, codec)
        assert taken == (kind == "good")
        if kind != "head":          # the old rule: whatever fitted stayed
            kept = [(i, v) for i, v in pairs if lo <= i < lo + n][:K]
            kept = dict(kept[:len(sent) // 2 - 1] if kind == "cut" else kept)
            half = scatter_accumulate(half, [(list(kept), list(kept.values()))])[0]
    rows += [pack_row(op=SparseOp.ROOT, lo=0, n=N, k=4), pack_row(op=SparseOp.END)]
    return rows, g, flits, want, bad_want, half


def _check_drop(got, want, bad_want, half):
    """The engine's (residual, final pairs, malformed) against the golden part after the
    ROOT's top-4; the half-applied part differs (the check has teeth)."""
    resid, out, bad = got
    sel = topk(want, 4)
    want_out = np.zeros(N, np.float32)
    want_out[sel] = want[sel]
    assert not np.array_equal(half.view(np.uint32), want.view(np.uint32))
    want = want.copy()
    want[sel] = 0
    assert np.array_equal(out.view(np.uint32), want_out.view(np.uint32))
    assert np.array_equal(resid.view(np.uint32), want.view(np.uint32))
    assert bad == bad_want


@pytest.mark.parametrize("codec,seed,stall", [(False, 1, 0.5), (False, 2, 0.0),
                                              (True, 3, 0.5), (True, 4, 0.0)])
def test_malformed_messages_leave_part_as_if_never_sent(codec, seed, stall):
    """Malformed messages of every detected kind (a tail count that disagrees, a pair
    outside the flow, a pair not above the one before, one pair over the budget, a stray
    flit type, a wrong head; codec: cut short) between good ones, on a stalled link, then a
    ROOT selection of the flow: the residual and the final pairs equal the golden receive
    rule's (malformed messages contribute nothing) bit for bit, and ``malformed`` counts one
    per message (a wrong head: its head and every pair, as before). The same messages
    applied half (their fitting pairs kept) would give another residual: skipping the
    rollback fails this test."""
    rows, g, flits, want, bad_want, half = _drop_case(codec, seed)
    _check_drop(_run(rows, g, flits, codec=codec, stall=stall, seed=seed), want, bad_want, half)


def _run_verilated(rows, grads, flits, *, codec, stall, seed):
    """:func:`_run` on the Verilated engine (``treenic.hdl.cosim``), one cycle a call; one
    build (with the codec, 16 rows, 128 flits a port) serves pair and codec programs."""
    import random
    from treenic.hdl.cosim import build_cosim
    assert len(rows) <= 16 and len(flits) <= 128
    eng = _engine(True, 1, 16, 128)
    prog = SparseProgram("ring:2", N, [rows], 1, N, 8, 128, 1)
    sim = build_cosim(eng, name="sparse_engine_drop").new()
    sim.reset()
    rng, host, flits = random.Random(seed), load_words(prog, 0, grads) + [start_word()], list(flits)
    ran = False
    for _ in range(20_000):
        if not (host or flits or not ran or sim["busy"]):
            break
        send = bool(flits) and rng.random() >= stall
        sim.set(host_i__valid=int(bool(host)), host_i__payload=host[0] if host else 0,
                rx__0__valid=int(send), rx__0__flit=flits[0] if send else 0)
        sim.eval()
        took = bool(host) and sim["host_i__ready"]
        sim.step()
        host, flits = host[took:], flits[send:]
        ran = ran or bool(sim["busy"])
    sim.set(rx__0__valid=0, host_i__valid=1, host_i__payload=dump_word(N), host_o__ready=1)
    sim.step()
    sim["host_i__valid"] = 0
    words = []
    for _ in range(20_000):
        sim.eval()
        valid, word = sim["host_o__valid"], sim["host_o__payload"]
        sim.step()
        if valid and word >> 65 & 1:
            break
        if valid:
            words.append(word)
    resid, out = decode_dump(words, N)
    return resid, out, sim["malformed"]


@pytest.mark.slow
@pytest.mark.skipif(not __import__("treenic.hdl.cosim", fromlist=["x"]).cosim_available() or
                    __import__("os").environ.get("TREENIC_RTL_TESTS") != "1",
                    reason="Verilated engine: needs verilator and TREENIC_RTL_TESTS=1")
@pytest.mark.parametrize("codec,seed", [(False, 5), (True, 6)])
def test_verilated_engine_drops_malformed_messages(codec, seed):
    """The same check on the Verilated engine (one small build for both, cached under
    build/cosim), link stalled half the cycles."""
    rows, g, flits, want, bad_want, half = _drop_case(codec, seed)
    got = _run_verilated(rows, g, flits, codec=codec, stall=0.5, seed=seed)
    _check_drop(got, want, bad_want, half)


def test_malformed_grecv_leaves_its_final_slot_empty():
    """A GRECV whose tail count disagrees contributes no final pair (its slot is left
    empty, not half-filled); the next GRECV fills its own slot."""
    rows = [pack_row(op=SparseOp.GRECV, step=1, chunk=0, lo=0, n=16, k=4),
            pack_row(op=SparseOp.GRECV, step=2, chunk=1, lo=16, n=16, k=4),
            pack_row(op=SparseOp.END)]
    flits = (_message(1, 0, [(1, 0.5), (3, -2.0)], count=3) +
             _message(2, 1, [(17, 1.25), (30, 4.0)]))
    resid, out, bad = _run(rows, np.zeros(N, np.float32), flits, chunks=2, stall=0.3)
    want = np.zeros(N, np.float32)
    want[[17, 30]] = [1.25, 4.0]
    assert np.array_equal(out.view(np.uint32), want.view(np.uint32))
    assert bad == 1 and not resid.any()


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


@pytest.mark.parametrize("lanes", [1, 3, 64, "2"])
def test_lanes_must_be_the_top_k_units_power_of_two(lanes):
    """W sizes the feeders' beats (a shift) and the buffer's banks: anything but a power of
    two in 2..32 is refused when the engine is built, not at elaboration."""
    with pytest.raises(ValueError, match="lanes must be a power of two in 2..32"):
        SparseEngine(ports=1, depth=64, lanes=lanes, max_flow=64, chunks=1, slot=8, rows=8,
                     rx_depth=32)
