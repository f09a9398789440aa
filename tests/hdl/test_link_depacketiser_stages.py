"""The depacketiser's check and commit stages (hdl/link/depacketiser.py: FragmentCheck,
FragmentCommit), each in Amaranth's simulator against its golden function
(hdl/link/model.py: check_flit, commit_stage) on random traffic: message and packet mode,
interleaved VCs, random corruption (dropped, duplicated, retyped flits, bad heads, orphans)
and random idle cycles, compared every cycle bit for bit."""
import random

import pytest
from amaranth.sim import Simulator

from treenic.hdl.link import model
from treenic.hdl.link.depacketiser import FragmentCheck, FragmentCommit
from treenic.hdl.link.flit import ErrorCause, FlitFormat

SUB_WORDS = 8
PACKET_WORDS = 8
FORMATS = [FlitFormat(vcs=2), FlitFormat(width=128, vcs=1, max_packet_words=8),
           FlitFormat(vcs=3)]


def _traffic(rng, fmt, n_msgs=14):
    """Messages in both modes on random VCs, interleaved flit by flit across VCs (each
    VC's order kept), then corrupted."""
    per_vc = [[] for _ in range(fmt.vcs)]
    for _ in range(n_msgs):
        mode = rng.choice([model.MESSAGE, model.PACKET])
        n = rng.choice([0, 1, rng.randint(1, 3 * SUB_WORDS)]) if mode == model.PACKET \
            else rng.randint(1, 3 * SUB_WORDS)
        vc = rng.randrange(fmt.vcs)
        h = dict(vc=vc, flow=rng.randrange(6), op=rng.choice([1, 2]), step=rng.randrange(9),
                 offset=rng.randrange(1 << 12), next=rng.randrange(4), eject=rng.randrange(2),
                 dest=rng.randrange(8), src=rng.randrange(8))
        per_vc[vc] += model.packetise(h, [rng.getrandbits(32) for _ in range(n)], mode, fmt,
                                      sub_words=SUB_WORDS, packet_words=PACKET_WORDS)
    flits = []
    while any(per_vc):
        q = rng.choice([q for q in per_vc if q])
        flits.append(q.pop(0))
    return model.mutate_flits(flits, rng, fmt, n=rng.randint(0, 6))


def _header_bits(fmt, header: dict) -> int:
    """A golden fragment header as the RTL's ``fmt.header`` value."""
    fields = {name: int(header.get(name, 0)) & ((1 << field.width) - 1)
              for name, field in fmt.header}
    return fmt.header.const(fields).as_value().value


def _check_inputs(fmt, flit, flow_enable):
    """The held flit's head checks as FlitInput registers them (HEAD_CHECKS)."""
    t, _, d = fmt.split_flit(flit)
    if t not in model._HEAD_TYPES:
        return 0
    _, cause, short = model.head_checks(fmt, t, d, flow_enable)
    return ((cause == ErrorCause.FLOW) | (cause == ErrorCause.OP) << 1
            | (cause == ErrorCause.LENGTH) << 2 | short << 3)


@pytest.mark.parametrize("fmt", FORMATS, ids=["w64v2", "w128v1", "w64v3"])
def test_fragment_check_matches_check_flit(fmt):
    rng = random.Random(fmt.width * 10 + fmt.vcs)
    flow_enable = 0b011111                       # flow 5 unknown: FLOW errors
    length_bits = max(SUB_WORDS, fmt.max_packet_words).bit_length()
    dut = FragmentCheck(fmt, sub_words=SUB_WORDS, length_bits=length_bits)
    flits = [f for _ in range(6) for f in _traffic(rng, fmt)]
    ctx = model.new_contexts(fmt)
    seen = {"commits": 0, "errors": 0}

    async def bench(sim):
        for i, flit in enumerate(flits):
            while rng.random() < 0.3:                    # idle cycles hold nothing
                sim.set(dut.held_valid, 0)
                await sim.tick()
            want = model.check_flit(ctx, flit, fmt, sub_words=SUB_WORDS,
                                    flow_enable=flow_enable)
            sim.set(dut.held.as_value(), flit)
            sim.set(dut.held_vc, fmt.split_flit(flit)[1])
            sim.set(dut.held_checks.as_value(), _check_inputs(fmt, flit, flow_enable))
            sim.set(dut.held_valid, 1)
            dec, err = dut.decision, dut.errors
            got = (sim.get(dec.accept), sim.get(dec.write), sim.get(dec.rollback),
                   sim.get(dec.commit))
            assert got == (want.accept, want.write, want.rollback, want.commit is not None), i
            causes = {ErrorCause.ORPHAN: err.orphan, ErrorCause.SEQ: err.seq,
                      ErrorCause.FLOW: err.flow, ErrorCause.OP: err.op,
                      ErrorCause.LENGTH: err.length}
            assert {c for c, s in causes.items() if sim.get(s)} == set(want.causes), i
            if want.commit is not None:
                h = want.commit.header
                if want.write:              # (a HEAD_TAIL's fragment has no words)
                    assert sim.get(dut.fragment_length) == h["length"], i
                assert sim.get(dut.commit_header).as_value().value == _header_bits(fmt, h), i
                seen["commits"] += 1
            seen["errors"] += len(want.causes)
            await sim.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert seen["commits"] > 20 and seen["errors"] > 3      # the traffic exercised both


@pytest.mark.parametrize("vcs, region_bits", [(2, 3), (1, 2), (3, 4)])
def test_fragment_commit_matches_commit_stage(vcs, region_bits):
    fmt = FlitFormat(vcs=vcs)
    length_bits = 7
    rng = random.Random(vcs * 100 + region_bits)
    dut = FragmentCommit(fmt, region_bits=region_bits, length_bits=length_bits)
    events = []
    for _ in range(600):
        if rng.random() < 0.25:
            events.append(None)
            continue
        rollback = rng.random() < 0.1
        write = not rollback and rng.random() < 0.8
        commit = not rollback and rng.random() < 0.3
        events.append((rng.randrange(vcs), write, rollback, commit,
                       rng.randrange(1 << length_bits), rng.getrandbits(fmt.header.size)))
    want = model.commit_stage(events, vcs=vcs, region_flits=1 << region_bits)
    stats = {"lengths": 0, "rollbacks": sum(1 for e in events if e and e[2])}

    async def bench(sim):
        for i, (ev, (addr, header, length)) in enumerate(zip(events, want)):
            data = rng.getrandbits(fmt.width)
            if ev is None:
                sim.set(dut.held_valid, 0)
            else:
                vc, write, rollback, commit, n, hdr = ev
                sim.set(dut.held_valid, 1)
                sim.set(dut.held_vc, vc)
                sim.set(dut.held_data, data)
                sim.set(dut.decision.as_value(), write << 1 | rollback << 2 | commit << 3)
                sim.set(dut.fragment_length, n)
                sim.set(dut.commit_header.as_value(), hdr)
            assert sim.get(dut.buf_en) == (addr is not None), i
            if addr is not None:
                assert (sim.get(dut.buf_addr), sim.get(dut.buf_data)) == (addr, data), i
            assert sim.get(dut.header_valid) == (header is not None), i
            if header is not None:
                assert sim.get(dut.header).as_value().value == header, i
            assert sim.get(dut.length_valid) == (length is not None), i
            if length is not None:
                n, vc = length
                assert sim.get(dut.length) == n | vc << length_bits, i
                stats["lengths"] += 1
            await sim.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert stats["lengths"] > 50 and stats["rollbacks"] > 20
