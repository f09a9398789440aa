"""The host's side of a simulated board's Ethernet: cocotbext-eth RGMII models + scapy.

:class:`HostPort` drives one board's RGMII pins: it sends UDP datagrams to the board,
answers the board's ARP requests for the host, and collects the board's UDP replies.
:func:`bridge` forwards datagrams between a real UDP socket on loopback and the board, so
the unchanged ``udp`` driver backend talks to the simulated board.
"""
from __future__ import annotations

import socket
import time

import cocotb
from cocotb.clock import Clock
from cocotb.queue import Queue
from cocotb.triggers import ClockCycles, Timer
from cocotbext.eth import GmiiFrame, RgmiiSink, RgmiiSource
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import ARP, Ether

HOST_MAC = "02:00:00:00:00:01"
HOST_IP = "192.168.1.100"
BOARD_MAC = "10:e2:d5:00:00:00"
BOARD_IP = "192.168.1.50"
UDP_PORT = 7411


class HostPort:
    """One board's RGMII pins seen from the host (``prefix``: the top's port prefix)."""

    def __init__(self, dut, prefix: str = "rgmii__", *, board_ip=BOARD_IP,
                 board_mac=BOARD_MAC):
        self.dut = dut
        p = prefix
        getattr(dut, p + "rx_ctl").value = 0
        getattr(dut, p + "rx_data").value = 0
        self.rx_clk = getattr(dut, p + "rx_clk")
        cocotb.start_soon(Clock(self.rx_clk, 8, unit="ns").start())
        self.source = RgmiiSource(getattr(dut, p + "rx_data"), getattr(dut, p + "rx_ctl"),
                                  self.rx_clk, mii_select=None)
        self.sink = RgmiiSink(getattr(dut, p + "tx_data"), getattr(dut, p + "tx_ctl"),
                              getattr(dut, p + "tx_clk"), mii_select=None)
        self.board_ip, self.board_mac = board_ip, board_mac
        self.replies: Queue = Queue()
        self.arp_replies = 0
        cocotb.start_soon(self._receive())

    async def _receive(self):
        while True:
            frame = await self.sink.recv()
            pkt = Ether(bytes(frame.get_payload()))
            if ARP in pkt and pkt[ARP].op == 1 and pkt[ARP].pdst == HOST_IP:
                reply = (Ether(src=HOST_MAC, dst=pkt.src) /
                         ARP(op=2, hwsrc=HOST_MAC, psrc=HOST_IP, hwdst=pkt.src,
                             pdst=pkt[ARP].psrc))
                await self.source.send(GmiiFrame.from_payload(bytes(reply)))
                self.arp_replies += 1
            elif UDP in pkt:
                await self.replies.put((bytes(pkt[UDP].payload), pkt[UDP].dport,
                                        pkt[IP].src))

    async def send(self, payload: bytes, sport: int = UDP_PORT, dport: int = UDP_PORT):
        pkt = (Ether(src=HOST_MAC, dst=self.board_mac) /
               IP(src=HOST_IP, dst=self.board_ip) / UDP(sport=sport, dport=dport) / payload)
        await self.source.send(GmiiFrame.from_payload(bytes(pkt)))

    async def request(self, payload: bytes, timeout_ns: int = 2_000_000):
        """Send one datagram, return the board's next reply payload (or None)."""
        await self.send(payload)
        waited = 0
        while self.replies.empty():
            await Timer(1000, unit="ns")
            waited += 1000
            if waited > timeout_ns:
                return None
        return (await self.replies.get())[0]


async def bridge(port: HostPort, sock: socket.socket, stop, poll_ns: int = 2000,
                 activity: dict | None = None):
    """Forward datagrams: UDP socket (host driver) -> board, board -> the last sender
    (the board itself answers to its own UDP port, LiteEth's quirk; the bridge maps that
    back to the sender's address).  ``activity["t"]`` is set at every datagram."""
    sock.setblocking(False)
    state = {"peer": None}

    async def back():
        while True:
            data, _, _ = await port.replies.get()
            if state["peer"] is not None:
                sock.sendto(data, state["peer"])
    cocotb.start_soon(back())
    while not stop():
        try:
            while True:
                data, state["peer"] = sock.recvfrom(65536)
                if activity is not None:
                    activity["t"] = time.monotonic()
                await port.send(data)
        except BlockingIOError:
            pass
        await Timer(poll_ns, unit="ns")


async def start_boards(dut, prefixes=("rgmii__",)) -> list:
    """Clocks (``clk`` 125 MHz, ``eth_clk`` 75 MHz) and reset of a simulated board top, a
    :class:`HostPort` on each prefix's RGMII pins; returns the ports once the boards are
    200 cycles out of reset."""
    dut.rst.value = 1
    dut.eth_rst.value = 1
    ports = [HostPort(dut, prefix=p) for p in prefixes]
    cocotb.start_soon(Clock(dut.clk, 8, unit="ns").start())
    cocotb.start_soon(Clock(dut.eth_clk, 13332, unit="ps").start())
    await ClockCycles(dut.clk, 20)
    dut.rst.value = 0
    dut.eth_rst.value = 0
    await ClockCycles(dut.clk, 200)
    return ports
