"""cocotb bench of the banked buffer against ``BankedBufferModel``, cycle by cycle."""
import random

import cocotb
from cocotb.triggers import ReadOnly, RisingEdge

from harness import bench_params, bench_seed, start_clock_and_reset
from treenic.hdl.nic.buffer import READ_LATENCY, BankedBufferModel


class Bench:
    def __init__(self, dut, p):
        self.dut, self.p = dut, p
        self.model = BankedBufferModel(depth=p["depth"], banks=p["banks"], lanes=p["lanes"],
                                       write_back=p["write_back"])
        self.rd = [self._port("rd", r) for r in range(p["readers"])]
        self.wr = [self._port("wr", w) for w in range(p["writers"])]
        self.stats = {"checked": 0, "blocked": 0, "conflicts": 0}

    def _port(self, kind, i):
        return lambda field: getattr(self.dut, f"{kind}__{i}__{field}")

    def idle(self):
        for rd in self.rd:
            rd("req").value = 0
            rd("addr").value = 0
            rd("write_only").value = 0
        for wr in self.wr:
            wr("en").value = 0
            wr("addr").value = 0
            wr("data").value = 0

    async def cycle(self, reads, writes):
        """Present this cycle's requests, compare what the buffer shows with the model."""
        L = self.p["lanes"]
        for rd, (req, addr, wo) in zip(self.rd, reads):
            rd("req").value, rd("addr").value, rd("write_only").value = int(req), addr, int(wo)
        padded = writes + [(0, 0, [0] * L)] * (len(self.wr) - len(writes))
        for wr, (addr, en, words) in zip(self.wr, padded):
            wr("addr").value, wr("en").value = addr, en
            wr("data").value = sum(v << (32 * k) for k, v in enumerate(words))
        grants, outs, conflict = self.model.cycle(reads, writes)
        await ReadOnly()
        for r, rd in enumerate(self.rd):
            assert int(rd("grant").value) == grants[r], f"reader {r}: grant"
            assert int(rd("valid").value) == (outs[r] is not None), f"reader {r}: valid"
            if outs[r] is not None:
                bits = str(rd("data").value)    # MSB first; a lane past the end may be X
                for k, want in enumerate(outs[r]):
                    if want is not None:        # None: a lane past the end, don't-care
                        lane = bits[len(bits) - 32 * (k + 1):len(bits) - 32 * k]
                        assert set(lane) <= {"0", "1"}, f"reader {r} lane {k}: {lane}"
                        got = int(lane, 2)
                        assert got == want, f"reader {r} lane {k}: {got:#x}, model {want:#x}"
                self.stats["checked"] += 1
        assert int(self.dut.conflict.value) == conflict, "conflict flag"
        self.stats["blocked"] += sum(q and not g for (q, _, _), g in zip(reads, grants))
        self.stats["conflicts"] += conflict
        await RisingEdge(self.dut.clk)

    def random_writes(self, rng):
        p, used, writes = self.p, set(), []
        for _ in range(p["writers"]):
            addr, en = rng.randrange(p["depth"]), rng.getrandbits(p["lanes"])
            en &= sum(1 << k for k in range(p["lanes"]) if addr + k < p["depth"])
            hit = {(addr + k) % p["banks"] for k in range(p["lanes"]) if en >> k & 1}
            if not p["conflicts"] and hit & used:
                en = 0                          # these writers never collide (the NIC's)
            used |= hit if en else set()
            writes.append((addr, en, [rng.getrandbits(32) for _ in range(p["lanes"])]))
        return writes


@cocotb.test()
async def random_traffic_matches_model(dut):
    p = bench_params()
    rng = random.Random(bench_seed())
    b = Bench(dut, p)
    await start_clock_and_reset(dut, init=lambda d: b.idle())
    await RisingEdge(dut.clk)
    idle = [(0, 0, False)] * p["readers"]
    L = p["lanes"]
    for a in range(0, p["depth"], L):          # fill through writer 0
        en = sum(1 << k for k in range(L) if a + k < p["depth"])
        await b.cycle(idle, [(a, en, [rng.getrandbits(32) for _ in range(L)])])
    for _ in range(p["cycles"]):
        reads = [(rng.random() < 0.7, rng.randrange(p["depth"]), rng.random() < 0.4)
                 for _ in range(p["readers"])]
        await b.cycle(reads, b.random_writes(rng))
    for a in list(range(0, p["depth"], L)) + [None] * READ_LATENCY:   # read-back, reader 0
        await b.cycle([(1, a, False)] + idle[1:] if a is not None else idle, [])
    s = b.stats
    assert s["checked"] > p["cycles"] // 4 and s["blocked"] > 0, f"too little exercised: {s}"
    assert (s["conflicts"] > 0) == p["conflicts"], f"conflicts {s['conflicts']}"
    dut._log.info(f"buffer bench: {s}")
