"""cocotb bench: flit count of the RTL packetiser for one long message (1 MiB default) with
an ideal receiver -> payload efficiency, checked against the golden model."""
import cocotb
from cocotb.triggers import ClockCycles, FallingEdge, ReadOnly, RisingEdge

from harness import bench_params, start_clock_and_reset
from link_common import kick_comb, fmt_from, u, write_result
from treenic.hdl.link import model


@cocotb.test()
async def one_long_message(dut):
    p = bench_params()
    fmt = fmt_from(p)
    mode, n = p["mode"], p["n_bytes"] // 4

    def init(d):
        kick_comb(d)
        d.hdr__valid.value = 0

    await start_clock_and_reset(dut, init=init)
    await FallingEdge(dut.clk)
    dut.hdr__payload.value = fmt.pack_header(flow=1, op=1, step=0, length=n)
    dut.hdr__valid.value = 1
    while True:                      # handshake at the rising edge after ready is seen
        await ReadOnly()
        ready = int(dut.hdr__ready.value)
        await RisingEdge(dut.clk)
        if ready:
            break
    dut.hdr__valid.value = 0
    cycles = 0
    while True:
        await ClockCycles(dut.clk, 1024)
        cycles += 1024
        if not int(dut.busy.value):
            break
        assert cycles < 4 * n, "packetiser did not finish"
    flits, heads = u(dut.status__flits), u(dut.status__heads)
    kw = dict(sub_words=p["sub_words"], packet_words=p["packet_words"])
    eff_golden = model.efficiency(n, mode, fmt, **kw)
    eff_rtl = n * 32 / (flits * fmt.width)
    assert abs(eff_rtl - eff_golden) < 1e-12, (eff_rtl, eff_golden)
    if mode == "message":
        assert heads == 1 and eff_rtl >= 0.99
    else:
        assert heads == -(-n // p["packet_words"])
    write_result(f"efficiency_{mode}_{fmt.width}.json",
                 {"mode": mode, "width": fmt.width, "n_bytes": p["n_bytes"], "flits": flits,
                  "heads": heads, "efficiency": eff_rtl, "cycles": cycles})
    dut._log.info(f"{mode}: {p['n_bytes']} B message -> {flits} flits ({heads} heads), "
                  f"payload efficiency {100 * eff_rtl:.4f}% (golden {100 * eff_golden:.4f}%)")
