"""Ethernet host interface: LiteEth's RGMII PHY + MAC + ARP/IPv4/UDP core, generated at
build time by its standalone generator, instantiated from Amaranth.

::

    RGMII pads ─► liteeth_core (eth domain, 75 MHz, 32-bit UDP port) ─► AsyncFIFO ─► rx
                                                                     ◄─ AsyncFIFO ◄─ tx
                                                                         (sync: the NIC)

Why LiteEth and why this shape (verified on this machine kind, see ``docs/boards.md``):

* the core is LiteEth 2024.12 from PyPI (``liteeth_gen``), pinned with litex 2024.12,
  liteiclink 2024.12 and migen 0.10.0 (``pip install 'treenic[synth]'``);
* its UDP port is 32 bits wide in a domain of its own at 75 MHz: post-route the core's
  IPv4 checksum path reaches about 100 MHz, so it cannot share the NIC's 125 MHz domain,
  and the 8-bit port at 125 MHz drops bytes after the CRC check without flagging it;
* ``lib.fifo.AsyncFIFO`` crosses both directions to the NIC's ``sync`` domain;
* LiteEth's ``raw_sink_dst_port`` is both its receive filter and the transmit
  destination port, so the board listens on :data:`UDP_PORT` and replies to the same port
  on the host (the peer's source port is carried but cannot be used).

The RGMII pads go straight to LiteEth's DDR primitives (IDDRX1F/ODDRX1F must sit on a
pad): with a platform the core gets the board's ``eth_rgmii`` resource, without one
(simulation) the :attr:`LiteEthHost.rgmii` signals.
"""
from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

from amaranth.hdl import Cat, ClockSignal, Const, Instance, Module, ResetSignal, Signal
from amaranth.lib import fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from .engine import datagram_layout

__all__ = ["UDP_PORT", "LiteEthHost", "core_config", "generate", "RgmiiSignature"]

#: the board's UDP port (receive filter and reply destination, see module docstring)
UDP_PORT = 7411
#: the LiteEth core's clock (its ``sys`` domain, ``eth`` here)
ETH_CLOCK_HZ = 75e6
#: receive FIFO: whole datagrams (the engine stops reading while it executes a request)
RX_FIFO_DEPTH = 1024
TX_FIFO_DEPTH = 16


def core_config(*, ip: str, mac: int, clk_freq: float = ETH_CLOCK_HZ,
                device: str = "LFE5UM5G-85F-8BG554", tx_delay: float = 2e-9,
                rx_delay: float = 0.0) -> dict:
    """The ``liteeth_gen`` YAML for an ECP5 RGMII board (ECPIX-5's KSZ9031: TX +2 ns,
    RX 0 ns, LiteX's skews for this board)."""
    return {"phy": "LiteEthECP5PHYRGMII", "vendor": "lattice", "toolchain": "trellis",
            "device": device, "phy_tx_delay": tx_delay, "phy_rx_delay": rx_delay,
            "clk_freq": clk_freq, "core": "udp", "mac_address": mac, "ip_address": ip,
            "data_width": 32, "udp_ports": {"raw": {"data_width": 32, "mode": "raw"}}}


def generate(out_dir: Path, config: dict, *, name: str = "liteeth_core") -> Path:
    """Run ``liteeth_gen`` for *config* into *out_dir* (skipped when the same config was
    generated there already); returns the path of ``<name>.v`` (module *name*)."""
    import yaml

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(config, sort_keys=True)
    if name != "liteeth_core":                     # (keeps existing caches valid)
        text += f"# module {name}\n"
    yml = out_dir / "core.yml"
    verilog = out_dir / "gateware" / f"{name}.v"
    stamp = out_dir / "core.sha1"
    digest = hashlib.sha1(text.encode()).hexdigest()
    if verilog.is_file() and stamp.is_file() and stamp.read_text() == digest:
        return verilog
    yml.write_text(text)
    r = subprocess.run([sys.executable, "-m", "liteeth.gen", "--output-dir", ".", "--name",
                        name, "core.yml"],
                       cwd=out_dir, capture_output=True, text=True)
    if r.returncode != 0 or not verilog.is_file():
        raise RuntimeError(f"liteeth_gen failed in {out_dir}:\n{r.stdout[-2000:]}\n"
                           f"{r.stderr[-2000:]}")
    stamp.write_text(digest)
    return verilog


class RgmiiSignature(wiring.Signature):
    """RGMII pins seen from the MAC (simulation only; on a board they are pads)."""

    def __init__(self):
        super().__init__({"tx_clk": Out(1), "tx_ctl": Out(1), "tx_data": Out(4),
                          "rx_clk": In(1), "rx_ctl": In(1), "rx_data": In(4),
                          "rst_n": Out(1)})


class LiteEthHost(wiring.Component):
    """LiteEth UDP core with its datagram streams crossed to the ``sync`` domain.

    Parameters
    ----------
    verilog : Path
        The core's Verilog from :func:`generate` (added to the platform's build).
    port : int
        The board's UDP port.
    module : str
        The core's module name (``generate(..., name=)``; two cores need two names).
    resource : int
        Which ``eth_rgmii`` resource the core drives on a board.  A resource without
        ``rst``/``mdc``/``mdio`` (a second PHY sharing them with the first) is fine.

    Members
    -------
    rx : Out(stream.Signature(datagram_layout()))
        Received datagrams (``sync`` domain); ``peer`` = source IPv4 address (bits 31..0)
        and UDP port (47..32), ``length`` = UDP payload bytes.
    tx : In(stream.Signature(datagram_layout()))
        Datagrams to send; ``peer`` bits 31..0 = destination address.
    rgmii : Out(RgmiiSignature())
        The PHY pins when elaborated without a platform.

    The ``eth`` domain (the core's 75 MHz clock) must be provided by the board top.
    """

    def __init__(self, *, verilog, port: int = UDP_PORT, module: str = "liteeth_core",
                 resource: int = 0):
        if not 0 < port < 65536:
            raise ValueError(f"UDP port must be 1..65535, not {port}")
        self.verilog, self.port = Path(verilog), port
        self.module, self.resource = module, resource
        layout = datagram_layout()
        super().__init__({"rx": Out(stream.Signature(layout)),
                          "tx": In(stream.Signature(layout)),
                          "rgmii": Out(RgmiiSignature())})

    def elaborate(self, platform):
        m = Module()
        w = 32 + 1 + 16 + 48
        m.submodules.rxq = rxq = fifo.AsyncFIFO(width=w, depth=RX_FIFO_DEPTH,
                                                r_domain="sync", w_domain="eth")
        m.submodules.txq = txq = fifo.AsyncFIFO(width=w, depth=TX_FIFO_DEPTH,
                                                r_domain="eth", w_domain="sync")
        # the core's receive stream (error/last_be/dst_port unused: the engine checks the
        # datagram's length, and the port filter already matched dst_port)
        src = {name: Signal(width, name=f"raw_source_{name}")
               for name, width in [("valid", 1), ("ready", 1), ("data", 32), ("last", 1),
                                   ("length", 16), ("ip_address", 32), ("src_port", 16),
                                   ("dst_port", 16), ("error", 1), ("last_be", 4)]}
        m.d.comb += [rxq.w_en.eq(src["valid"]), src["ready"].eq(rxq.w_rdy),
                     rxq.w_data.eq(Cat(src["data"], src["last"], src["length"],
                                       src["ip_address"], src["src_port"])),
                     self.rx.valid.eq(rxq.r_rdy), rxq.r_en.eq(self.rx.ready),
                     self.rx.payload.eq(rxq.r_data)]
        tx_in = self.tx.payload
        m.d.comb += [txq.w_en.eq(self.tx.valid), self.tx.ready.eq(txq.w_rdy),
                     txq.w_data.eq(Cat(tx_in.data, tx_in.last, tx_in.length, tx_in.peer))]
        out = txq.r_data
        sink_ready = Signal(name="raw_sink_ready")
        m.d.comb += txq.r_en.eq(sink_ready)
        ports = dict(
            i_sys_clock=ClockSignal("eth"), i_sys_reset=ResetSignal("eth"),
            i_raw_sink_valid=txq.r_rdy, o_raw_sink_ready=sink_ready,
            i_raw_sink_data=out[:32], i_raw_sink_last=out[32],
            i_raw_sink_last_be=Cat(Const(0, 3), out[32]), i_raw_sink_length=out[33:49],
            i_raw_sink_ip_address=out[49:81], i_raw_sink_dst_port=self.port,
            i_raw_sink_src_port=self.port)
        for name, s in src.items():
            ports[("i_" if name == "ready" else "o_") + f"raw_source_{name}"] = s
        ports.update(self._pins(m, platform))
        m.submodules.core = Instance(self.module, **ports)
        if platform is not None:
            platform.add_file(f"{self.module}.v", self.verilog.read_text())
        return m

    def _pins(self, m, platform) -> dict:
        if platform is None:
            r = self.rgmii
            return dict(o_rgmii_clocks_tx=r.tx_clk, o_rgmii_tx_ctl=r.tx_ctl,
                        o_rgmii_tx_data=r.tx_data, i_rgmii_clocks_rx=r.rx_clk,
                        i_rgmii_rx_ctl=r.rx_ctl, i_rgmii_rx_data=r.rx_data,
                        o_rgmii_rst_n=r.rst_n, o_rgmii_mdc=Signal(name="mdc"),
                        i_rgmii_mdio=Const(1), i_rgmii_int_n=Const(1))
        p = platform.request("eth_rgmii", self.resource, dir="-")
        ctl = "ctrl" if hasattr(p, "tx_ctrl") else "ctl"       # ECPIX-5 vs Colorlight names
        # raw pad ports (.io): the PHY reset pin is active low on the pad, as rst_n is
        pins = dict(o_rgmii_clocks_tx=p.tx_clk.io, o_rgmii_tx_ctl=getattr(p, f"tx_{ctl}").io,
                    o_rgmii_tx_data=p.tx_data.io, i_rgmii_clocks_rx=p.rx_clk.io,
                    i_rgmii_rx_ctl=getattr(p, f"rx_{ctl}").io, i_rgmii_rx_data=p.rx_data.io,
                    i_rgmii_int_n=Const(1))
        if hasattr(p, "rst"):                  # else shared with (and driven by) another core
            pins.update(o_rgmii_rst_n=p.rst.io, o_rgmii_mdc=p.mdc.io, i_rgmii_mdio=p.mdio.io)
        else:
            pins.update(o_rgmii_rst_n=Signal(name="rst_n_shared"),
                        o_rgmii_mdc=Signal(name="mdc_shared"), i_rgmii_mdio=Const(1))
        return pins
