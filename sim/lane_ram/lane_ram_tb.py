"""cocotb bench of ``LaneBankedRam``: the word port returns the word a Python list holds at
its address, lane l of the lanes port the word at ``addr + l`` (mod depth), each as written
before the read's clock edge; a word whose read collided with its write is XORed with the
poison (``treenic.hdl.ram.poison``); a port whose enable is low holds its words."""
import random

import cocotb
from cocotb.triggers import FallingEdge, ReadOnly, RisingEdge

from harness import bench_params, bench_seed, start_clock_and_reset
from treenic.hdl.ram import poison


def _init(dut):
    for s in ("w_addr", "w_data", "w_en", "r_addr", "r_en", "l_addr", "l_en"):
        getattr(dut, s).value = 0


def _words(ref, addrs, wa, we, mask):
    return [ref[a] ^ (mask if we and a == wa else 0) for a in addrs]


@cocotb.test()
async def random_word_and_lanes_reads(dut):
    p = bench_params()
    rng = random.Random(bench_seed())
    depth, width, banks = p["depth"], p["width"], p["banks"]
    mask, word_mask = poison(width).value, (1 << width) - 1
    await start_clock_and_reset(dut, init=_init)
    ref = [0] * depth
    # what each port shows, as the model has it; None until its first enabled read (a read
    # register that never loaded is X in Icarus: the contract leaves it unspecified)
    shown = {"r": None, "l": None}
    seen = {"word": 0, "lanes": 0, "held": 0, "poisoned": 0}
    await FallingEdge(dut.clk)
    for _ in range(p["n"]):
        wa, wd, we = rng.randrange(depth), rng.getrandbits(width), rng.random() < 0.7
        ra = rng.randrange(depth)
        la = (wa - rng.randrange(banks)) % depth if rng.random() < 0.33 else rng.randrange(depth)
        en = {"r": rng.random() < 0.8, "l": rng.random() < 0.8}
        dut.w_addr.value, dut.w_data.value, dut.w_en.value = wa, wd, int(we)
        dut.r_addr.value, dut.r_en.value = ra, int(en["r"])
        dut.l_addr.value, dut.l_en.value = la, int(en["l"])
        await RisingEdge(dut.clk)
        await ReadOnly()
        if en["r"]:
            shown["r"] = _words(ref, [ra], wa, we, mask)
        if en["l"]:
            lanes = [(la + l) % depth for l in range(banks)]
            shown["l"] = _words(ref, lanes, wa, we, mask)
            seen["poisoned"] += we and wa in lanes
        seen["held"] += not (en["r"] and en["l"])
        if we:
            ref[wa] = wd
        if shown["r"] is not None:
            got = int(dut.r_data.value)
            assert got == shown["r"][0], f"word: got {got:#x}, want {shown['r'][0]:#x}"
            seen["word"] += 1
        if shown["l"] is not None:
            packed = int(dut.l_data.value)
            got = [(packed >> (width * l)) & word_mask for l in range(banks)]
            assert got == shown["l"], f"lanes: got {[hex(g) for g in got]}, " \
                                      f"want {[hex(w) for w in shown['l']]}"
            seen["lanes"] += 1
        await FallingEdge(dut.clk)
    assert min(seen.values()) > p["n"] // 20, seen
