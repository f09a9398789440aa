"""cocotb bench of ``BankedBuffer`` against ``BankedBufferModel`` (cycle by cycle).

Each cycle the bench drives random read requests (some ``write_only``) and writes, then
compares, in the same cycle, what the buffer shows with what the model says it shows:
every reader's ``grant``, ``valid`` and ``data`` (lanes past the end of the buffer are
don't-care) and ``conflict``.  Idle stretches let the pipeline drain; a full read-back
through the host reader ends the run."""
import random

import cocotb
from cocotb.triggers import ReadOnly, RisingEdge

from harness import bench_params, bench_seed, start_clock_and_reset
from treenic.hdl.nic.buffer import READ_LATENCY, BankedBufferModel


def _port(dut, name):
    return getattr(dut, name)


def _init_for(p):
    def init(dut):
        for r in range(p["readers"]):
            _port(dut, f"rd__{r}__req").value = 0
            _port(dut, f"rd__{r}__addr").value = 0
            _port(dut, f"rd__{r}__write_only").value = 0
        for w in range(p["writers"]):
            _port(dut, f"wr__{w}__en").value = 0
            _port(dut, f"wr__{w}__addr").value = 0
            _port(dut, f"wr__{w}__data").value = 0
    return init


async def cycle(dut, model, p, reads, writes, stats):
    """Drive one cycle, compare with the model in its read-only phase, step the clock."""
    L = p["lanes"]
    for r, (req, addr, wo) in enumerate(reads):
        _port(dut, f"rd__{r}__req").value = int(req)
        _port(dut, f"rd__{r}__addr").value = addr
        _port(dut, f"rd__{r}__write_only").value = int(wo)
    padded = writes + [(0, 0, [0] * L)] * (p["writers"] - len(writes))
    for w, (addr, en, words) in enumerate(padded):
        _port(dut, f"wr__{w}__addr").value = addr
        _port(dut, f"wr__{w}__en").value = en
        _port(dut, f"wr__{w}__data").value = sum(v << (32 * k) for k, v in enumerate(words))
    grants, outs, conflict = model.cycle(reads, writes)
    await ReadOnly()
    for r in range(p["readers"]):
        assert int(_port(dut, f"rd__{r}__grant").value) == grants[r], f"reader {r} grant"
        valid = int(_port(dut, f"rd__{r}__valid").value)
        assert valid == (outs[r] is not None), f"reader {r} valid"
        if outs[r] is not None:
            data = int(_port(dut, f"rd__{r}__data").value)
            for k, want in enumerate(outs[r]):
                if want is not None:
                    assert (data >> (32 * k)) & 0xFFFFFFFF == want, f"reader {r} lane {k}"
            stats["words"] += 1
    assert int(dut.conflict.value) == conflict, "conflict"
    stats["grants"] += sum(grants)
    stats["refused"] += sum(bool(q) and not g for (q, _, _), g in zip(reads, grants))
    stats["conflicts"] += conflict
    await RisingEdge(dut.clk)


@cocotb.test()
async def random_traffic_vs_model(dut):
    p = bench_params()
    rng = random.Random(bench_seed())
    depth, banks, L = p["depth"], p["banks"], p["lanes"]
    model = BankedBufferModel(depth=depth, banks=banks, lanes=L, write_back=p["write_back"])
    await start_clock_and_reset(dut, init=_init_for(p))
    stats = {"grants": 0, "refused": 0, "words": 0, "conflicts": 0}
    idle = [(0, 0, 0)] * p["readers"]
    for a in range(0, depth, L):                      # fill
        en = sum(1 << k for k in range(L) if a + k < depth)
        await cycle(dut, model, p, idle, [(a, en, [rng.getrandbits(32) for _ in range(L)])],
                    stats)
    for c in range(p["cycles"]):
        if rng.random() < 0.1:                        # an idle stretch: the pipeline drains
            for _ in range(rng.randrange(1, READ_LATENCY + 2)):
                await cycle(dut, model, p, idle, [], stats)
            continue
        reads = [(rng.random() < 0.6, rng.randrange(depth), rng.random() < 0.3)
                 for _ in range(p["readers"])]
        writes, used = [], set()
        for _ in range(p["writers"]):
            addr, en = rng.randrange(depth), rng.getrandbits(L)
            en &= sum(1 << k for k in range(L) if addr + k < depth)
            hit = {(addr + k) % banks for k in range(L) if en >> k & 1}
            if not p["conflicts"] and hit & used:
                en = 0
            used |= hit if en else set()
            writes.append((addr, en, [rng.getrandbits(32) for _ in range(L)]))
        await cycle(dut, model, p, reads, writes, stats)
    for a in list(range(0, depth, L)) + [None] * READ_LATENCY:     # read back
        reads = [(1, a, 0)] + idle[1:] if a is not None else idle
        await cycle(dut, model, p, reads, [], stats)
    dut._log.info(f"buffer bench: {stats}")
    assert stats["refused"] > 0 and stats["words"] > p["cycles"] // 4
    assert (stats["conflicts"] > 0) == p["conflicts"]
