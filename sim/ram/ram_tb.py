"""cocotb bench of ``BlockRam``: every read returns the word a Python list holds at its
address (written before the read's clock edge, not at it), except a read that collided with
the write of its word, which returns that word XOR the poison (``treenic.hdl.ram.poison``);
a read port whose enable is low holds its word."""
import random

import cocotb
from cocotb.triggers import FallingEdge, ReadOnly, RisingEdge

from harness import bench_params, bench_seed, start_clock_and_reset
from treenic.hdl.ram import poison


def _init(dut):
    for s in ("w_addr", "w_data", "w_en", "r0_addr", "r1_addr", "r1_en"):
        getattr(dut, s).value = 0


@cocotb.test()
async def random_reads_writes_and_collisions(dut):
    p = bench_params()
    rng = random.Random(bench_seed())
    depth, width = p["depth"], p["width"]
    mask = poison(width).value
    await start_clock_and_reset(dut, init=_init)
    ref = [0] * depth
    # the word each read port shows, as the model has it: (word, collided); None until the
    # port's first enabled read (a read register that never loaded is X in Icarus: the
    # contract leaves it unspecified)
    shown = {"r0": None, "r1": None}
    seen = {"plain": 0, "poisoned": 0, "held": 0}
    await FallingEdge(dut.clk)
    for _ in range(p["n"]):
        wa, wd, we = rng.randrange(depth), rng.getrandbits(width), rng.random() < 0.7
        ra = {r: wa if rng.random() < 0.33 else rng.randrange(depth) for r in ("r0", "r1")}
        en = {"r0": True, "r1": rng.random() < 0.75}
        dut.w_addr.value, dut.w_data.value, dut.w_en.value = wa, wd, int(we)
        dut.r0_addr.value, dut.r1_addr.value = ra["r0"], ra["r1"]
        dut.r1_en.value = int(en["r1"])
        await RisingEdge(dut.clk)
        await ReadOnly()
        for r in shown:
            if en[r]:
                shown[r] = (ref[ra[r]], we and ra[r] == wa)
            else:
                seen["held"] += 1
        if we:
            ref[wa] = wd
        for r, read in shown.items():
            if read is None:
                continue
            word, collided = read
            want = word ^ mask if collided else word
            got = int(getattr(dut, f"{r}_data").value)
            assert got == want, f"{r}: got {got:#x}, want {want:#x} (collided {collided})"
            seen["poisoned" if collided else "plain"] += 1
        await FallingEdge(dut.clk)
    assert min(seen.values()) > p["n"] // 20, seen
