"""Single-NIC cocotb benches: one node of a schedule against golden neighbours with random
arrival order, gaps and TX backpressure (make sim)."""
from dataclasses import asdict

import pytest

from harness import run_bench, sim_name
from treenic.firmware.image import compile_images
from treenic.hdl.nic import Nic
from treenic.hdl.nic.host import params_for_images

CASES = [
    # name, topology, algorithm, node, elements, mode, order, send_prob, stall, credit_delay
    ("torus_n5", "torus:4x4", "multitree", 5, 70, "message", True, 0.7, 0.3, 6),
    ("torus_n5_noorder", "torus:4x4", "multitree", 5, 70, "message", False, 0.9, 0.2, 3),
    ("ring_n3_packet", "ring:8", "ring", 3, 45, "packet", True, 0.6, 0.4, 8),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_nic_vs_golden_neighbours(case):
    name, spec, alg, node, E, mode, order, sp, stall, cd = case
    from treenic.algorithms import build
    images = compile_images(None, build(alg, spec), E)
    params = params_for_images(images, depth=128, max_entries=64, mode=mode,
                               sub_words=8, packet_words=8, credits=6,
                               # Icarus: 4 banks (fast, conflict-heavy); Verilator: the default
                               banks=4 if sim_name() == "icarus" else None)
    run_bench(Nic(params), name=f"nic_{name}", test_module="nic_tb",
              params={"nic": asdict(params), "topology": spec, "algorithm": alg,
                      "node": node, "elements": E, "order": order, "send_prob": sp,
                      "images": images.to_bytes().hex(),
                      "stall": stall, "credit_delay": cd, "max_cycles": 20000})
