"""pytest entries of the link-layer cocotb benches (``make sim``; SIM=icarus|verilator).

One bench per block -- packetiser, depacketiser, packetiser -> link -> depacketiser
loopback -- plus the RTL flit count of a 1 MiB message (payload efficiency)."""
import pytest

from harness import REPO_ROOT, run_bench
from link_tops import EfficiencyTop, LoopbackTop
from treenic.hdl.link.flit import FlitFormat
from treenic.hdl.link.packetiser import Packetiser
from treenic.hdl.link.depacketiser import Depacketiser

FMT = {}          # FlitFormat() defaults: 64-bit flits, 2 VCs
SUB, PKT = 8, 8   # small sub-packets / packets: many boundaries per message


@pytest.mark.parametrize("mode", ["message", "packet"])
def test_packetiser(mode):
    credits = 3
    run_bench(Packetiser(FlitFormat(**FMT), mode=mode, sub_words=SUB, packet_words=PKT,
                         credits=credits),
              name=f"link_packetiser_{mode}", test_module="link_packetiser_tb",
              params=dict(fmt=FMT, mode=mode, sub_words=SUB, packet_words=PKT,
                          credits=credits, n_msgs=40, max_words=40, p_idle=0.25,
                          max_credit_delay=12))


def test_depacketiser():
    run_bench(Depacketiser(FlitFormat(**FMT), sub_words=SUB, credits=4),
              name="link_depacketiser", test_module="link_depacketiser_tb",
              params=dict(fmt=FMT, sub_words=SUB, packet_words=PKT, credits=4,
                          p_stalls=[0.2, 0.6, 0.85, 0.4],
                          n_msgs=16, max_words=40, max_faults=6, p_idle=0.25))


@pytest.mark.parametrize("mode", ["message", "packet"])
def test_loopback(mode):
    credits, latency, stall = 4, 3, 80
    run_bench(LoopbackTop(FlitFormat(**FMT), mode=mode, sub_words=SUB, packet_words=PKT,
                          credits=credits, latency=latency, stall=stall, seed=0x1D2C),
              name=f"link_loopback_{mode}", test_module="link_loopback_tb",
              params=dict(fmt=FMT, mode=mode, sub_words=SUB, packet_words=PKT,
                          n_msgs=40, max_words=48, p_idle=0.2, p_stall=0.25, stall=stall))


@pytest.mark.parametrize("mode", ["message", "packet"])
def test_efficiency_1mib(mode):
    """RTL flit count of one 1 MiB message: message-based >= 99 % payload efficiency,
    packet mode (256-byte packets) for comparison.  JSON under build/sim/link_results/."""
    n_bytes, sub, pkt = 1 << 20, 64, 64
    out = REPO_ROOT / "build" / "sim" / "link_results"
    run_bench(EfficiencyTop(FlitFormat(**FMT), mode=mode, sub_words=sub, packet_words=pkt),
              name=f"link_efficiency_{mode}", test_module="link_efficiency_tb",
              params=dict(fmt=FMT, mode=mode, n_bytes=n_bytes, sub_words=sub,
                          packet_words=pkt),
              extra_env={"TREENIC_LINK_RESULTS": str(out)})
