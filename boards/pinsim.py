"""Simulated boards at their RGMII pins, fast: Verilated board tops stepped by a C++
harness, no cocotb.

Why: the cocotb cluster (``sim/board/cluster_tb.py``) runs about 1 us of simulated time
per wall second.  Its cost is Python per clock edge: cocotbext-eth's RGMII source and sink
are coroutines woken on every edge of every board's RGMII clocks, plus the cocotb
scheduler and VPI around each of them (``docs/boards.md`` has the profile).  Here the
same RTL runs with Python touching whole frames only:

* one board top (:class:`PinBoard`: :class:`~treenic.boards.core.BoardCore` with its
  LiteEth RGMII PHY/MAC/UDP core, host protocol engine, NIC and the serial link PHYs) is
  Verilated once (:func:`treenic.hdl.cosim.build_cosim`, C++ ``-O2``) and instantiated
  once per board;
* the C++ harness (:data:`HARNESS_CPP`) drives the clocks (``sync`` and the RGMII
  receive clock 125 MHz, ``eth`` 75 MHz), wires each board's serial link lanes to its
  peer's receive lanes every cycle (as :class:`~treenic.boards.cluster.BoardCluster`
  does in one netlist) and is each board's Ethernet PHY at the pins: it sends frames
  with preamble, SFD, padding and FCS nibble by nibble on both edges of ``rx_clk``, and
  collects the board's transmit nibbles from ``tx_data``/``tx_ctl`` on both edges,
  checking preamble, SFD and FCS;
* Python (:class:`PinCluster`, :func:`serve`) builds and parses Ethernet/IPv4/UDP/ARP
  frames and bridges them to UDP sockets on loopback, so the unchanged ``udp`` driver
  backend talks to the boards.

The cocotbext-eth benches stay the independent reference for the RGMII path: the same
requests through both give the same replies (``tests/test_pinsim.py``).

Simulated time only advances while something happens: after ``idle_cycles`` without a
frame on any pin and with no NIC running, :func:`serve` waits for the next datagram
instead of clocking idle boards.
"""
from __future__ import annotations

import ctypes
import json
import os
import select
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from amaranth.hdl import DomainRenamer, Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from treenic import topology as topo_mod
from treenic.hdl.host.liteeth import UDP_PORT, RgmiiSignature
from treenic.hdl.nic import NicParams
from treenic.hdl.nic.fabric import wiring_plan

from .core import SERIAL_LANES, BoardCore

__all__ = ["PinBoard", "PinCluster", "HARNESS_CPP", "build_pin_board", "serve",
           "udp_frame", "parse_frame", "arp_reply", "HOST_MAC", "HOST_IP", "BOARD_MAC",
           "BOARD_IP", "SIMULATOR"]

#: what runs the boards, for reports
SIMULATOR = "Verilator C++ harness (RGMII PHY model in C++, no cocotb)"
HOST_MAC = bytes.fromhex("020000000001")
HOST_IP = bytes([192, 168, 1, 100])
BOARD_MAC = bytes.fromhex("10e2d5000000")
BOARD_IP = bytes([192, 168, 1, 50])
#: harness return codes of ``pc_run``
RUN_LIMIT, RUN_FRAME, RUN_IDLE = 0, 1, 2


class PinBoard(wiring.Component):
    """One simulated board's top: :class:`BoardCore` with serial links, every link
    receive domain on the board's ``sync`` clock (all boards share one clock here).

    Parameters
    ----------
    params : NicParams
        The board's NIC.
    verilog : Path
        The generated ``liteeth_core.v``.

    Members
    -------
    rgmii : Out(RgmiiSignature())
        Ethernet pins.
    lanes_tx, lanes_rx : Out/In(2 * SERIAL_LANES).array(ports)
        Serial link lanes per NIC port.
    running, done : Out(1)
        The NIC's status.
    links_up : Out(ports)
        Trained links.
    """

    def __init__(self, *, params: NicParams, verilog):
        self.params, self.verilog = params, verilog
        super().__init__({"rgmii": Out(RgmiiSignature()),
                          "lanes_tx": Out(2 * SERIAL_LANES).array(params.ports),
                          "lanes_rx": In(2 * SERIAL_LANES).array(params.ports),
                          "running": Out(1), "done": Out(1), "links_up": Out(params.ports)})

    def elaborate(self, platform):
        m = Module()
        p = self.params
        core = BoardCore(params=p, verilog=self.verilog, links="serial")
        m.submodules.board = b = DomainRenamer({f"link{i}_rx": "sync"
                                                for i in range(p.ports)})(core)
        wiring.connect(m, b.rgmii, wiring.flipped(self.rgmii))
        for i in range(p.ports):
            m.d.comb += [self.lanes_tx[i].eq(b.lanes_tx[i]), b.lanes_rx[i].eq(self.lanes_rx[i])]
        m.d.comb += [self.running.eq(b.running), self.done.eq(b.done),
                     self.links_up.eq(b.links_up)]
        return m


# The harness: appended to hdl/cosim.py's generated wrapper (Handle, set_port, get_port).
HARNESS_CPP = r"""
// ---- treenic.boards.pinsim: N boards, their clocks, lanes and RGMII PHYs ----
#include <deque>
#include <array>

static uint32_t pc_crc_table[256];
static void pc_crc_init() {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        pc_crc_table[i] = c;
    }
}
static uint32_t pc_crc32(const uint8_t* d, size_t n) {       // Ethernet FCS
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) c = pc_crc_table[(c ^ d[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

// pins[]: clk rst eth_clk eth_rst rx_clk rx_ctl rx_data tx_ctl tx_data running
enum { P_CLK, P_RST, P_ETH_CLK, P_ETH_RST, P_RX_CLK, P_RX_CTL, P_RX_DATA, P_TX_CTL,
       P_TX_DATA, P_RUNNING, P_N };

struct PcRx {                           // the PHY's receive side: host -> board pins
    std::deque<std::vector<uint8_t>> queue;   // line bytes: preamble, SFD, frame, FCS
    size_t pos = 0;
    bool busy = false;
    int gap = 0;                        // inter-frame gap still to send (byte times)
};
struct PcTx {                           // the PHY's transmit side: board pins -> host
    std::vector<uint8_t> cur;
    uint8_t low = 0, en = 0;
    std::deque<std::vector<uint8_t>> done;    // frames without preamble, SFD and FCS
};
struct PcCluster {
    int n;
    std::vector<Handle*> b;
    int pin[P_N];
    std::vector<std::array<int, 4>> wires;    // (u, lanes_tx port, v, lanes_rx port)
    std::vector<PcRx> rx;
    std::vector<PcTx> tx;
    int clk = 0, eth = 0;
    uint64_t t_ps = 0, next_clk = 4000, next_eth = 6666, cycles = 0, last_busy = 0;
    uint64_t frames_in = 0, frames_out = 0, fcs_errors = 0, framing_errors = 0;
};

static inline void pc_set(Handle* h, int idx, uint32_t v) { set_port(h->m, idx, &v); }
static inline uint32_t pc_get(Handle* h, int idx) { uint32_t v = 0; get_port(h->m, idx, &v); return v; }

static void pc_finish(PcCluster* c, PcTx& t) {
    std::vector<uint8_t>& f = t.cur;
    size_t k = 0;
    while (k < f.size() && f[k] == 0x55) k++;
    if (k == 0 || k >= f.size() || f[k] != 0xD5 || f.size() - k - 1 < 64) {
        c->framing_errors++;
    } else {
        const uint8_t* d = f.data() + k + 1;
        size_t n = f.size() - k - 1 - 4;
        uint32_t fcs = d[n] | d[n + 1] << 8 | d[n + 2] << 16 | (uint32_t)d[n + 3] << 24;
        if (pc_crc32(d, n) != fcs) c->fcs_errors++;
        else { t.done.emplace_back(d, d + n); c->frames_out++; }
    }
    f.clear();
}

// one clock event: the next edge of clk/rx_clk (125 MHz) and/or eth_clk (75 MHz)
static void pc_event(PcCluster* c) {
    bool do_clk = c->next_clk <= c->next_eth, do_eth = c->next_eth <= c->next_clk;
    if (do_clk) { c->t_ps = c->next_clk; c->clk ^= 1; c->next_clk += 4000; }
    if (do_eth) { c->t_ps = c->next_eth; c->eth ^= 1; c->next_eth += 6666; }
    bool rise = do_clk && c->clk, fall = do_clk && !c->clk;
    bool busy = false;
    for (int u = 0; u < c->n; u++) {
        Handle* h = c->b[u];
        if (do_clk) {
            PcRx& r = c->rx[u];
            uint32_t ctl = 0, data = 0;
            if (rise && !r.busy) {
                if (r.gap > 0) r.gap--;
                else if (!r.queue.empty()) { r.busy = true; r.pos = 0; }
            }
            if (r.busy) {               // low nibble at the rising edge, high at the falling
                uint8_t byte = r.queue.front()[r.pos];
                ctl = 1;
                data = rise ? byte & 0xF : byte >> 4;
                if (fall && ++r.pos == r.queue.front().size()) {
                    r.queue.pop_front(); r.busy = false; r.gap = 12; c->frames_in++;
                }
            }
            busy |= r.busy || !r.queue.empty();
            pc_set(h, c->pin[P_CLK], c->clk);
            pc_set(h, c->pin[P_RX_CLK], c->clk);
            pc_set(h, c->pin[P_RX_CTL], ctl);
            pc_set(h, c->pin[P_RX_DATA], data);
        }
        if (do_eth) pc_set(h, c->pin[P_ETH_CLK], c->eth);
        h->m->eval();
        if (do_clk) {                   // ODDR outputs: D0 while the clock is high, D1 low
            PcTx& t = c->tx[u];
            uint32_t ctl = pc_get(h, c->pin[P_TX_CTL]) & 1, data = pc_get(h, c->pin[P_TX_DATA]) & 0xF;
            if (rise) { t.en = ctl; t.low = data; }
            else if (t.en) t.cur.push_back(t.low | data << 4);
            else if (!t.cur.empty()) pc_finish(c, t);
            busy |= t.en || !t.cur.empty();
        }
    }
    if (rise) {
        c->cycles++;
        for (auto& w : c->wires) pc_set(c->b[w[2]], w[3], pc_get(c->b[w[0]], w[1]));
        for (int u = 0; u < c->n && !busy; u++) busy = pc_get(c->b[u], c->pin[P_RUNNING]) & 1;
        if (busy) c->last_busy = c->cycles;
    }
}

extern "C" {

void* pc_new(int n, void** handles, const int* pins, int n_wires, const int* wires) {
    pc_crc_init();
    PcCluster* c = new PcCluster;
    c->n = n;
    for (int u = 0; u < n; u++) c->b.push_back((Handle*)handles[u]);
    for (int k = 0; k < P_N; k++) c->pin[k] = pins[k];
    for (int w = 0; w < n_wires; w++)
        c->wires.push_back({wires[4*w], wires[4*w+1], wires[4*w+2], wires[4*w+3]});
    c->rx.resize(n); c->tx.resize(n);
    return c;
}

void pc_free(void* p) { delete (PcCluster*)p; }

// reset: sync and eth resets high for `hold` 125 MHz cycles, then `settle` more cycles
void pc_reset(void* p, uint64_t hold, uint64_t settle) {
    PcCluster* c = (PcCluster*)p;
    for (int u = 0; u < c->n; u++) { pc_set(c->b[u], c->pin[P_RST], 1); pc_set(c->b[u], c->pin[P_ETH_RST], 1); }
    uint64_t end = c->cycles + hold;
    while (c->cycles < end) pc_event(c);
    for (int u = 0; u < c->n; u++) { pc_set(c->b[u], c->pin[P_RST], 0); pc_set(c->b[u], c->pin[P_ETH_RST], 0); }
    end = c->cycles + settle;
    while (c->cycles < end) pc_event(c);
}

// run until a board sent a frame (1), nothing happened for idle_cycles (2) or
// max_cycles passed (0)
int pc_run(void* p, uint64_t max_cycles, uint64_t idle_cycles) {
    PcCluster* c = (PcCluster*)p;
    uint64_t end = c->cycles + max_cycles;
    while (c->cycles < end) {
        pc_event(c);
        for (int u = 0; u < c->n; u++) if (!c->tx[u].done.empty()) return 1;
        if (c->cycles - c->last_busy >= idle_cycles) return 2;
    }
    return 0;
}

// queue one frame (destination MAC .. payload) for board u: preamble, SFD, padding to
// 60 bytes and the FCS are added here
void pc_push(void* p, int u, const uint8_t* d, int n) {
    PcCluster* c = (PcCluster*)p;
    std::vector<uint8_t> line(7, 0x55);
    line.push_back(0xD5);
    line.insert(line.end(), d, d + n);
    while (line.size() < 8 + 60) line.push_back(0);
    uint32_t fcs = pc_crc32(line.data() + 8, line.size() - 8);
    for (int k = 0; k < 4; k++) line.push_back((fcs >> (8 * k)) & 0xFF);
    c->rx[u].queue.push_back(std::move(line));
    c->last_busy = c->cycles;
}

// the next frame board u sent (without FCS) into buf; its length, or -1 when none
int pc_pop(void* p, int u, uint8_t* buf, int cap) {
    PcCluster* c = (PcCluster*)p;
    auto& q = c->tx[u].done;
    if (q.empty()) return -1;
    int n = (int)q.front().size();
    if (n > cap) n = cap;
    memcpy(buf, q.front().data(), n);
    q.pop_front();
    return n;
}

// cycles, simulated ps, frames in, frames out, FCS errors, framing errors
void pc_stats(void* p, uint64_t* out) {
    PcCluster* c = (PcCluster*)p;
    uint64_t v[6] = {c->cycles, c->t_ps, c->frames_in, c->frames_out, c->fcs_errors,
                     c->framing_errors};
    memcpy(out, v, sizeof v);
}

}  // extern "C"
"""


def build_pin_board(params: NicParams, *, verbose: bool = False):
    """Verilate one :class:`PinBoard` with the harness (cached under ``build/cosim``);
    returns the :class:`~treenic.hdl.cosim.CosimLibrary`.

    The Verilog is written by a child Python with a fixed hash seed: Amaranth's port order
    follows set iteration, so text from this process would differ run to run and miss the
    cache (a fresh Verilator build: minutes)."""
    from dataclasses import asdict
    from treenic.hdl.cosim import build_cosim
    from .boardsim import liteeth_sources
    src = liteeth_sources()
    code = ("import json, sys; from treenic.boards.pinsim import pin_board_verilog; "
            "sys.stdout.write(pin_board_verilog(json.loads(sys.argv[1]), sys.argv[2]))")
    r = subprocess.run([sys.executable, "-c", code, json.dumps(asdict(params)), str(src[0])],
                       env={**os.environ, "PYTHONHASHSEED": "0"}, capture_output=True,
                       text=True)
    if r.returncode != 0:
        raise RuntimeError(f"pinsim: elaborating the board failed:\n{r.stderr[-3000:]}")
    return build_cosim(r.stdout, name="pin_board", extra_sources=src, extra_cpp=HARNESS_CPP,
                       opt="-O2", opt_slow="-O0", jobs=2,
                       verilator_args=["--no-timing", "-Wno-STMTDLY", "-Wno-ASSIGNDLY"],
                       verbose=verbose)


def pin_board_verilog(params: dict, liteeth_verilog: str) -> str:
    """Amaranth's Verilog of a :class:`PinBoard` (module ``pin_board``)."""
    from amaranth.back import verilog
    return verilog.convert(PinBoard(params=NicParams(**params), verilog=Path(liteeth_verilog)),
                           name="pin_board")


class PinCluster:
    """N simulated boards of *topology* at their RGMII pins (see the module docstring).

    Parameters
    ----------
    topology : str or None
        A direct topology (``ring:4``): node ``u`` is board ``u``; links pin to pin.
        ``None``: one board, links unconnected.
    params : NicParams
        Every board's NIC.
    """

    _PINS = ("clk", "rst", "eth_clk", "eth_rst", "rgmii__rx_clk", "rgmii__rx_ctl",
             "rgmii__rx_data", "rgmii__tx_ctl", "rgmii__tx_data", "running")

    def __init__(self, topology: str | None, params: NicParams, *, library=None):
        if topology is None:                         # one board, its links unconnected
            self.topology, self.plan, self._n = None, [], 1
        else:
            self.topology = topo_mod.parse(topology) if isinstance(topology, str) else topology
            if self.topology.max_ports() > params.ports:
                raise ValueError(f"{self.topology.spec} needs {self.topology.max_ports()} "
                                 f"ports, the boards' NIC has {params.ports}")
            self.plan = wiring_plan(self.topology)   # refuses switched topologies
            self._n = self.topology.n
        self.params = params
        self.library = library or build_pin_board(params)
        lib = self.library.lib
        vp = ctypes.c_void_p
        lib.pc_new.restype = vp
        lib.pc_new.argtypes = [ctypes.c_int, ctypes.POINTER(vp), ctypes.POINTER(ctypes.c_int),
                               ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
        lib.pc_free.argtypes = [vp]
        lib.pc_reset.argtypes = [vp, ctypes.c_uint64, ctypes.c_uint64]
        lib.pc_run.argtypes = [vp, ctypes.c_uint64, ctypes.c_uint64]
        lib.pc_run.restype = ctypes.c_int
        lib.pc_push.argtypes = [vp, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.pc_pop.argtypes = [vp, ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
        lib.pc_pop.restype = ctypes.c_int
        lib.pc_stats.argtypes = [vp, ctypes.POINTER(ctypes.c_uint64)]
        self._lib = lib
        n = self._n
        self.boards = [self.library.new() for _ in range(n)]
        ports = self.library.ports
        pins = (ctypes.c_int * len(self._PINS))(*[ports[p].index for p in self._PINS])
        wires = [x for (u, i, v, j) in self.plan
                 for x in (u, ports[f"lanes_tx__{i}"].index, v, ports[f"lanes_rx__{j}"].index)]
        handles = (vp * n)(*[b.handle.value for b in self.boards])
        self._h = vp(lib.pc_new(n, handles, pins, len(self.plan),
                                (ctypes.c_int * max(1, len(wires)))(*wires)))
        self._buf = ctypes.create_string_buffer(4096)

    @property
    def n(self) -> int:
        return self._n

    def reset(self, hold: int = 20, settle: int = 200):
        self._lib.pc_reset(self._h, hold, settle)

    def push(self, board: int, frame: bytes):
        """Queue an Ethernet frame (destination MAC .. payload) for *board*'s pins."""
        self._lib.pc_push(self._h, board, frame, len(frame))

    def pop(self, board: int) -> bytes | None:
        n = self._lib.pc_pop(self._h, board, self._buf, len(self._buf))
        return None if n < 0 else self._buf.raw[:n]

    def run(self, max_cycles: int, idle_cycles: int = 1 << 62) -> int:
        """Clock the boards until one sent a frame (:data:`RUN_FRAME`), nothing
        happened for *idle_cycles* (:data:`RUN_IDLE`) or *max_cycles* passed."""
        return self._lib.pc_run(self._h, max_cycles, idle_cycles)

    def stats(self) -> dict:
        v = (ctypes.c_uint64 * 6)()
        self._lib.pc_stats(self._h, v)
        return dict(zip(("cycles", "sim_ps", "frames_in", "frames_out", "fcs_errors",
                         "framing_errors"), map(int, v)))

    def close(self):
        if self._h:
            self._lib.pc_free(self._h)
            self._h = None
        for b in self.boards:
            b.close()


# ----------------------------------------------------------------------------------
# frames (the host's network stack, as cocotb's board_net builds them with scapy)

def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    s = int(np.frombuffer(data, dtype=">u2").sum(dtype=np.uint64))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def udp_frame(payload: bytes, sport: int = UDP_PORT, dport: int = UDP_PORT, *,
              dst_mac: bytes = BOARD_MAC, dst_ip: bytes = BOARD_IP) -> bytes:
    """Ethernet II / IPv4 / UDP frame from the host to a board (checksums filled in)."""
    ulen = 8 + len(payload)
    ip = bytearray(struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + ulen, 1, 0, 64, 17, 0,
                               HOST_IP, dst_ip))
    ip[10:12] = struct.pack(">H", _checksum(bytes(ip)))
    pseudo = HOST_IP + dst_ip + struct.pack(">BBH", 0, 17, ulen)
    udp = struct.pack(">HHHH", sport, dport, ulen, 0) + payload
    csum = _checksum(pseudo + udp) or 0xFFFF
    return (dst_mac + HOST_MAC + b"\x08\x00" + bytes(ip) + udp[:6] +
            struct.pack(">H", csum) + payload)


def arp_reply(request: bytes) -> bytes | None:
    """The host's ARP reply to a board's request for :data:`HOST_IP` (else ``None``)."""
    if len(request) < 42 or request[12:14] != b"\x08\x06":
        return None
    op, sha, spa, tpa = request[20:22], request[22:28], request[28:32], request[38:42]
    if op != b"\x00\x01" or tpa != HOST_IP:
        return None
    return (sha + HOST_MAC + b"\x08\x06" + struct.pack(">HHBBH", 1, 0x0800, 6, 4, 2) +
            HOST_MAC + HOST_IP + sha + spa)


def parse_frame(frame: bytes):
    """``("udp", payload, sport, dport)``, ``("arp", request)`` or ``("other", frame)``."""
    et = frame[12:14]
    if et == b"\x08\x06":
        return ("arp", frame)
    if et == b"\x08\x00" and len(frame) >= 42 and frame[23] == 17:
        ihl = (frame[14] & 0xF) * 4
        total = struct.unpack(">H", frame[16:18])[0]
        u = 14 + ihl
        sport, dport, ulen = struct.unpack(">HHH", frame[u:u + 6])
        end = min(14 + total, u + ulen)
        return ("udp", bytes(frame[u + 8:end]), sport, dport)
    return ("other", frame)


# ----------------------------------------------------------------------------------
# the bridge

def serve(topology: str, params: NicParams, addr_file: str, stop_file: str, *,
          idle_s: float = 600, idle_cycles: int = 20000, chunk: int = 4000,
          log=None) -> dict:
    """Run *topology*'s boards, each behind a UDP socket on 127.0.0.1, until *stop_file*
    exists or no datagram came for *idle_s* seconds; returns the harness statistics.

    A datagram on board u's socket goes to board u as a UDP frame (host port 7411 ->
    7411); the board's UDP replies go back to the socket's last sender, its ARP requests
    for the host are answered here."""
    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    t0, cpu0 = time.monotonic(), time.process_time()
    cl = PinCluster(topology, params)
    cl.reset()
    socks = []
    for _ in range(cl.n):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", 0))
        s.setblocking(False)
        socks.append(s)
    peers = [None] * cl.n
    tmp = addr_file + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"boards": [list(s.getsockname()) for s in socks], "simulator": SIMULATOR,
                   "started": time.time()}, f)
    os.replace(tmp, addr_file)
    log(f"pinsim: {cl.n} boards up in {time.monotonic() - t0:.1f} s")
    last = time.monotonic()
    counts = {"datagrams_in": 0, "datagrams_out": 0, "arp_replies": 0, "other_frames": 0}
    while not os.path.exists(stop_file) and time.monotonic() - last < idle_s:
        for u, s in enumerate(socks):
            while True:
                try:
                    data, peers[u] = s.recvfrom(65536)
                except BlockingIOError:
                    break
                cl.push(u, udp_frame(data))
                counts["datagrams_in"] += 1
                last = time.monotonic()
        r = cl.run(chunk, idle_cycles)
        for u in range(cl.n):
            while (f := cl.pop(u)) is not None:
                kind, *rest = parse_frame(f)
                if kind == "udp" and peers[u] is not None:
                    socks[u].sendto(rest[0], peers[u])
                    counts["datagrams_out"] += 1
                elif kind == "arp" and (rep := arp_reply(f)) is not None:
                    cl.push(u, rep)
                    counts["arp_replies"] += 1
                else:
                    counts["other_frames"] += 1
        if r == RUN_IDLE:
            select.select(socks, [], [], 0.2)
    stats = {**cl.stats(), **counts, "wall_s": round(time.monotonic() - t0, 1),
             "cpu_s": round(time.process_time() - cpu0, 1)}
    for s in socks:
        s.close()
    cl.close()
    log("pinsim: stopped " + json.dumps(stats))
    return stats


# ----------------------------------------------------------------------------------
# the same requests through this harness and through the cocotbext-eth reference

def agreement_requests(params: NicParams, seed: int = 1) -> list[str]:
    """Host-protocol datagrams (hex) for comparing the two simulators: ID and PARAMS
    reads, a 200-word buffer WRITE and READ, a malformed datagram (no reply), a WRITE
    retried with the same sequence number (DUP) and a READ of what stayed."""
    from treenic.hdl.host.model import Op, encode_request
    from treenic.hdl.nic.params import Reg
    rng = np.random.default_rng(seed)
    words = [int(w) for w in rng.integers(0, 1 << 32, 200, dtype=np.uint64)]
    bad = bytearray(encode_request(Op.WRITE, 9, params.buf_addr(0), payload=[1, 2]))
    bad[17] ^= 0x40
    reqs = [encode_request(Op.READ, 1, int(Reg.ID), 1),
            encode_request(Op.READ, 2, int(Reg.PARAMS), 1),
            encode_request(Op.WRITE, 3, params.buf_addr(0), payload=words),
            encode_request(Op.READ, 4, params.buf_addr(0), 200), bytes(bad),
            encode_request(Op.WRITE, 5, params.buf_addr(0), payload=[7]),
            encode_request(Op.WRITE, 5, params.buf_addr(0), payload=[9]),
            encode_request(Op.READ, 6, params.buf_addr(0), 2)]
    return [r.hex() for r in reqs]


def bulk_writes(params: NicParams, n: int = 16, seed: int = 2) -> list[str]:
    """*n* 1 KiB buffer WRITEs (hex), sent back to back to measure the host link."""
    from treenic.hdl.host.model import Op, encode_request
    data = [int(w) for w in np.random.default_rng(seed).integers(0, 1 << 32, 256,
                                                                 dtype=np.uint64)]
    return [encode_request(Op.WRITE, 100 + k, params.buf_addr(256 * (k % 4)),
                           payload=data).hex() for k in range(n)]


def run_requests(cl: PinCluster, board: int, requests: list[str], bulk: list[str], *,
                 timeout_cycles: int = 250_000) -> dict:
    """Send *requests* one at a time to *board* (each waits for its reply or
    *timeout_cycles*), then *bulk* back to back; replies (hex or ``None``) and the bulk
    WRITE payload rate in simulated time."""

    def collect(want: int, limit: int) -> list[bytes]:
        got, end = [], cl.stats()["cycles"] + limit
        while len(got) < want and cl.stats()["cycles"] < end:
            cl.run(min(2000, end - cl.stats()["cycles"]))
            while (f := cl.pop(board)) is not None:
                kind, *rest = parse_frame(f)
                if kind == "arp" and (rep := arp_reply(f)) is not None:
                    cl.push(board, rep)
                elif kind == "udp":
                    got.append(rest[0])
        return got

    replies = []
    for r in requests:
        cl.push(board, udp_frame(bytes.fromhex(r)))
        got = collect(1, timeout_cycles)
        replies.append(got[0].hex() if got else None)
    t0 = cl.stats()["sim_ps"]
    for r in bulk:
        cl.push(board, udp_frame(bytes.fromhex(r)))
    got = collect(len(bulk), 100 * timeout_cycles)
    dt_ns = (cl.stats()["sim_ps"] - t0) / 1000
    mbps = len(bulk) * 1024 * 8 / dt_ns * 1000 if len(got) == len(bulk) else None
    return {"replies": replies, "bulk_replies": len(got), "bulk_payload_mbps": mbps,
            "sim_ns": dt_ns}
