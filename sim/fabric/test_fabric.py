"""System-level fabric benches: full all-reduces on N RTL NICs (make sim)."""
from pathlib import Path

import pytest

from harness import run_bench, icarus_fixups, sim_name
from treenic.algorithms import build
from treenic.hdl.nic.fabric import Fabric, nic_verilog
from treenic.firmware.image import compile_images
from treenic.hdl.nic.host import params_for_images
from dataclasses import asdict

REPO = Path(__file__).resolve().parents[2]
REPORT = REPO / "build" / "sim" / "fabric_report.json"

# (name, topology, algorithm, elements icarus, elements verilator, mode, latency, stall,
#  forward)
CASES = [
    ("ring8", "ring:8", "ring", 37, 1000, "message", 2, 40, "store"),
    ("mesh2x2", "mesh:2x2", "multitree", 50, 2000, "message", 3, 60, "store"),
    ("torus4x4", "torus:4x4", "multitree", 35, 1000, "message", 1, 30, "store"),
    ("mesh2x2_packet", "mesh:2x2", "multitree", 70, 2000, "packet", 2, 40, "store"),
    # cut-through forwarding (NicParams.forward): TX reads paced on the sources' progress
    ("ring8_cut", "ring:8", "ring", 37, 1000, "message", 2, 40, "cut-through"),
    ("mesh2x2_cut", "mesh:2x2", "multitree", 50, 2000, "message", 3, 60, "cut-through"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_fabric_allreduce(case):
    name, spec, alg, e_ic, e_vl, mode, latency, stall, forward = case
    sim = sim_name()
    E = e_vl if sim == "verilator" else e_ic
    images = compile_images(None, build(alg, spec), E)
    params = params_for_images(images, max_entries=64, mode=mode,
                               sub_words=16, packet_words=16, credits=8, forward=forward,
                       # Icarus: 4 banks (a smaller crossbar simulates fast and makes bank
                       # conflicts frequent); Verilator: the default, as synthesised
                               banks=4 if sim == "icarus" else None)
    out = REPO / "build" / "sim" / f"fabric_{name}" / sim
    out.mkdir(parents=True, exist_ok=True)
    modname = f"fabric_{name}_nic"
    text = nic_verilog(params, name=modname)
    if sim == "icarus":
        text = icarus_fixups(text)
    nicv = out / "nic.v"
    if not nicv.exists() or nicv.read_text() != text:
        nicv.write_text(text)
    fab = Fabric(spec, params, latency=latency, stall=stall, seed=7, nic_module=modname)
    run_bench(fab, name=f"fabric_{name}", test_module="fabric_tb", extra_sources=[nicv],
              params={"name": f"{name}-{sim}", "topology": spec, "algorithm": alg,
                      "elements": E, "nic": asdict(params),
                      "images": images.to_bytes().hex(),
                      "node_bits": fab.hw_layout["node"].width,
                      "addr_bits": fab.hw_layout["addr"].width,
                      "latency": latency, "stall": stall, "report": str(REPORT)})
