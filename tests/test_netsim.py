"""Network timing model (treenic.netsim): flit counts, structure, bad input, RTL validation."""
import numpy as np
import pytest

from treenic.algorithms import build
from treenic.hdl.nic.model import message_flits as golden_flits
from treenic.hdl.nic.params import NicParams
from treenic.netsim.sim import NetsimError, simulate
from treenic.netsim.timing import RTL, NicTiming, message_flits


@pytest.mark.parametrize("mode,pw", [("message", 64), ("packet", 16), ("packet", 64)])
def test_flit_counts_equal_golden_packetiser(mode, pw):
    rng = np.random.default_rng(3)
    params = NicParams(mode=mode, packet_words=pw, depth=4096)
    timing = RTL.with_(mode=mode, packet_words=pw)
    for words in [1, 2, 3, 15, 16, 17, pw - 1, pw, pw + 1, *rng.integers(1, 4000, 40)]:
        assert message_flits(int(words), timing) == golden_flits(int(words), params), words


def test_contention_free_multitree_runs_at_link_rate():
    """64 KiB on torus:4x4: every step of MultiTree moves one chunk per link, so the model's
    time is the per-step flits plus per-step latencies -- above the ideal, within 15 %."""
    from treenic.hdl.nic.fabric_sim import params_for
    from treenic.hdl.nic.model import ideal_cycles
    s = build("multitree", "torus:4x4")
    r = simulate(s, 16384, RTL.with_(link_latency_cycles=1))
    ideal = ideal_cycles(s, 16384, params_for(s, 16384))
    assert ideal < r.cycles < 1.15 * ideal
    assert len(r.step_cycles_node0) == s.steps


def test_contention_slows_shared_links():
    """DBTree on a torus routes over multi-hop paths that share links: its time under the
    model exceeds the same schedule with every link's load alone (more bytes per link)."""
    s = build("dbtree", "torus:4x4")
    r = simulate(s, 1 << 16)
    ring = simulate(build("ring", "torus:4x4"), 1 << 16)
    assert r.cycles > ring.cycles


def test_packet_mode_costs_head_flits():
    s = build("multitree", "mesh:2x2")
    m = simulate(s, 8192, RTL.with_(mode="message"))
    p = simulate(s, 8192, RTL.with_(mode="packet", packet_words=16))
    assert p.head_flits > m.head_flits and p.cycles > m.cycles


def test_cut_through_is_faster_than_store_and_forward():
    s = build("multitree", "torus:4x4")
    a = simulate(s, 1 << 16, RTL.with_(forward="store"))
    b = simulate(s, 1 << 16, RTL.with_(forward="cut-through"))
    assert b.cycles < a.cycles


def test_switch_network_runs():
    for spec in ("fattree:16", "bigraph:4x8"):
        r = simulate(build("multitree", spec), 4096)
        assert r.cycles > 0 and r.messages > 0


def test_bad_input():
    s = build("ring", "ring:4")
    with pytest.raises(NetsimError, match="elements"):
        simulate(s, 0)
    with pytest.raises(NetsimError, match="Schedule"):
        simulate("ring:4", 10)
    with pytest.raises(ValueError, match="mode"):
        NicTiming(mode="wormhole")
