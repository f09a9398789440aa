"""``make sim`` entry for the banked block RAM (``treenic.hdl.ram.LaneBankedRam``): a write
port, a word read port and a lanes read port (both with an enable) under random traffic,
a third of the lanes reads overlapping the word being written; the golden model is a
Python list, a colliding read's word XORed with the simulation poison."""
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.hdl import Cat, Module

from harness import run_bench, sim_name
from treenic.hdl.ram import LaneBankedRam

DEPTH, WIDTH, BANKS = 256, 32, 4


class LaneRamBench(wiring.Component):
    """The LaneBankedRam's ports as a component's ports (a bench wrapper, no logic)."""

    def __init__(self):
        ab = (DEPTH - 1).bit_length()
        super().__init__({"w_addr": In(ab), "w_data": In(WIDTH), "w_en": In(1),
                          "r_addr": In(ab), "r_en": In(1), "r_data": Out(WIDTH),
                          "l_addr": In(ab), "l_en": In(1), "l_data": Out(WIDTH * BANKS)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.ram = ram = LaneBankedRam(width=WIDTH, depth=DEPTH, banks=BANKS)
        w, r, lanes = ram.write_port(), ram.read_port(), ram.lanes_port()
        m.d.comb += [w.addr.eq(self.w_addr), w.data.eq(self.w_data), w.en.eq(self.w_en),
                     r.addr.eq(self.r_addr), r.en.eq(self.r_en), self.r_data.eq(r.data),
                     *lanes.at(self.l_addr), lanes.en.eq(self.l_en),
                     self.l_data.eq(Cat(*lanes.data))]
        return m


def test_lane_ram_bench():
    n = 40_000 if sim_name() == "verilator" else 8_000
    run_bench(LaneRamBench(), name="lane_ram", test_module="lane_ram_tb",
              params={"n": n, "depth": DEPTH, "width": WIDTH, "banks": BANKS})
