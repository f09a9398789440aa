"""``make sim`` entry for the block RAM (``treenic.hdl.ram.BlockRam``): one write port and
two read ports (one with an enable) under random traffic, a third of the reads aimed at the
word being written; the golden model is a Python list, with a colliding read's word XORed
with the simulation poison."""
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.hdl import Module

from harness import run_bench, sim_name
from treenic.hdl.ram import BlockRam

DEPTH, WIDTH = 256, 32


class RamBench(wiring.Component):
    """The BlockRam's ports as a component's ports (a bench wrapper, no logic)."""

    def __init__(self):
        ab = (DEPTH - 1).bit_length()
        super().__init__({"w_addr": In(ab), "w_data": In(WIDTH), "w_en": In(1),
                          "r0_addr": In(ab), "r0_data": Out(WIDTH),
                          "r1_addr": In(ab), "r1_en": In(1), "r1_data": Out(WIDTH)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.ram = ram = BlockRam(shape=WIDTH, depth=DEPTH, init=[])
        w, r0, r1 = ram.write_port(), ram.read_port(), ram.read_port()
        m.d.comb += [w.addr.eq(self.w_addr), w.data.eq(self.w_data), w.en.eq(self.w_en),
                     r0.addr.eq(self.r0_addr), self.r0_data.eq(r0.data),
                     r1.addr.eq(self.r1_addr), r1.en.eq(self.r1_en), self.r1_data.eq(r1.data)]
        return m


def test_ram_bench():
    n = 40_000 if sim_name() == "verilator" else 8_000
    run_bench(RamBench(), name="ram", test_module="ram_tb",
              params={"n": n, "depth": DEPTH, "width": WIDTH})
