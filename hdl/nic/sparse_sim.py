"""MultiTree-Sparse and TopkA on the Verilated sparse fabric
(:class:`~.sparse_fabric.SparseFabric` through :mod:`treenic.hdl.cosim`), checked against the
golden model every iteration.

``SparseFabricSim(topology, elements, density)`` compiles the sparse program from the golden
model (:func:`treenic.schedule.sparse_table.compile_sparse`, or ``compile_topka`` for
``algorithm="topka"``) into the configuration image set
(:func:`treenic.firmware.image.sparse_images`, version 3) and loads the engines from the
serialized images (:func:`program_from_image_bytes`: PROG rows, regions and the hash seed
decoded from the bytes), builds (cached under
``build/cosim``) the fabric sized for it, and :meth:`run` performs one error-feedback
iteration: host words (program once, then the gradients) through every node's host stream
in parallel, one fabric-wide ``start``, clocking until every engine is idle, then every
node's dump (residual, final pairs). :meth:`run_checked` also steps the golden model and
compares results and residuals bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from treenic.firmware.image import ImageSet, decode_sparse_program, sparse_images
from treenic.schedule.sparse_table import (SPARSE_ALGORITHMS, SparseProgram, program_golden,
                                           sparse_model)

from .sparse_fabric import SparseFabric, decode_program_dump, dump_request, load_words

__all__ = ["SparseFabricSim", "SparseRun", "ENGINE_NAME", "RTL_ALGORITHMS", "sparse_model",
           "program_from_image_bytes", "imaged_model"]

#: sparse all-reduces the sparse engine runs (the programs ``treenic.schedule.sparse_table``
#: compiles)
RTL_ALGORITHMS = SPARSE_ALGORITHMS

def program_from_image_bytes(data: bytes) -> SparseProgram:
    """The sparse program a serialized image set (:meth:`ImageSet.to_bytes`) loads: decoded
    and checked (:func:`~treenic.firmware.image.decode_sparse_program`)."""
    return decode_sparse_program(ImageSet.from_bytes(data))


def imaged_model(algorithm: str, topology: str, elements: int, density: float, **kw):
    """(golden model, configuration image set, the program decoded from the set's bytes):
    :func:`sparse_model`'s program through the image (:func:`sparse_images`, serialized,
    :func:`program_from_image_bytes`), so every fabric run loads the engines from the
    image -- the image is the path, not a side artefact."""
    golden, compiled = sparse_model(algorithm, topology, elements, density, **kw)
    images = sparse_images(compiled)
    return golden, images, program_from_image_bytes(images.to_bytes())


#: this fabric of stand-alone engines (the bench's sparse_fabric section and the network
#: model's calibration runs use it; the CLI and the fabric server run the fabric of
#: combined NICs, :mod:`.sparse_nic_sim`)
ENGINE_NAME = "Verilated sparse NIC fabric (treenic.hdl.nic.sparse_sim)"


@dataclass
class SparseRun:
    results: np.ndarray       # (P, N) float32: every node's reduced vector
    residuals: np.ndarray     # (P, N) float32: every node's residual after the iteration
    cycles: int               # start to the last engine's END
    malformed: int            # malformed messages / pairs counted by all engines
    link_bytes: int           # flit data bytes (8 a flit) all links carried in the run
    bit_exact: bool | None = None   # vs the golden (run_checked)


class SparseFabricSim:
    """Verilated sparse fabric running MultiTree-Sparse or TopkA.

    Args:
        topology: spec (``"ring:4"``, ``"torus:4x4"``).
        elements: float32 elements per node.
        density: top-k density (budget per flow ``max(1, floor(density * |flow|))``).
        lanes: top-k lanes W.
        topk_units: top-k units per engine (selections of independent flows at once).
        stall, latency, seed: link channels (stall probability /256), golden seed (also
            the hash seed of ``flow_assignment="hash"``).
        flow_assignment: ``"contiguous"`` or ``"hash"`` (Zen's h0 from the golden's
            ``partition_of``; the host sends element order and the engines' hash placers,
            :mod:`.sparse_place`, compute the buffer order).
        size_density: build the buffers for this (larger) density, so that one Verilated
            build serves a density sweep (default: ``density``).
        opt: C++ optimisation of the Verilated model (default ``-O2``, ``-O1`` above 8
            nodes: the 16-node fabric compiles in a fraction of the time).
        algorithm: ``"multitree-sparse"`` or ``"topka"`` (:data:`RTL_ALGORITHMS`).
        residual: MultiTree-Sparse's ``"local"`` or ``"global"`` residual.
        codec: codec messages (pairs or bitmap + values) instead of one pair a flit.
    """

    def __init__(self, topology: str, elements: int, density: float, *, lanes: int = 16,
                 topk_units: int = 2, stall: int = 0, latency: int = 1, seed: int = 0,
                 flow_assignment: str = "contiguous", size_density: float | None = None,
                 opt: str | None = None, verbose: bool = False,
                 algorithm: str = "multitree-sparse", residual: str = "local",
                 codec: bool = False):
        kw = dict(seed=seed, flow_assignment=flow_assignment, residual=residual, codec=codec)
        #: golden model; the configuration image set the engines are loaded from (version
        #: 3); the program the host sequence sends (PROG rows, regions, hash seed),
        #: decoded from the serialized images
        golden, images, program = imaged_model(algorithm, topology, elements, density, **kw)
        sizing = program if size_density is None else imaged_model(
            algorithm, topology, elements, size_density, **kw)[2]
        self._build(golden, images, program, sizing, lanes=lanes, topk_units=topk_units,
                    stall=stall, latency=latency, seed=seed, opt=opt, verbose=verbose)

    @classmethod
    def from_images(cls, images: ImageSet, *, program: SparseProgram | None = None,
                    lanes: int = 16, topk_units: int = 2, stall: int = 0, latency: int = 1,
                    seed: int = 0, opt: str | None = None,
                    verbose: bool = False) -> "SparseFabricSim":
        """The fabric loaded with a received image set's sparse program (the fabric server's
        LOAD_CONFIG): ``program`` is the set's, already decoded and checked
        (:func:`treenic.driver.config.parse_sparse_program`), else decoded here. Nothing is
        compiled: the golden model (for :meth:`run_checked`) is the program's own
        parameters' (:func:`~treenic.schedule.sparse_table.program_golden`; ``seed`` only
        where the program has none)."""
        self = cls.__new__(cls)
        program = program if program is not None else decode_sparse_program(images)
        self._build(program_golden(program, seed), images, program, program, lanes=lanes,
                    topk_units=topk_units, stall=stall, latency=latency, seed=seed, opt=opt,
                    verbose=verbose)
        return self

    def _build(self, golden, images, program, sizing, *, lanes, topk_units, stall, latency,
               seed, opt, verbose) -> None:
        from treenic.hdl.cosim import build_cosim
        self.golden, self.images, self.program = golden, images, program
        self.P, self.N = len(program.rows), program.elements
        fabric = SparseFabric(sizing, lanes=lanes, topk_units=topk_units, stall=stall,
                              latency=latency, seed=seed + 1)
        tag = program.topology.replace(":", "").replace("x", "_")
        opt = opt or ("-O2" if self.P <= 8 else "-O1")
        self.lib = build_cosim(fabric, name=f"sparse_fabric_{tag}", opt=opt, verbose=verbose)
        self.sim = self.lib.new()
        self.sim.reset()
        self.loaded = False

    def run(self, grads: np.ndarray, *, max_cycles: int = 20_000_000) -> SparseRun:
        P, N, sim = self.P, self.N, self.sim
        grads = np.asarray(grads, np.float32)
        inputs = {}
        for u in range(P):
            words = load_words(self.program, u, grads[u])
            if self.loaded:
                words = words[len(self.program.rows[u]):]
            inputs[f"host_i__{u}"] = words
        sim.run_streams(inputs=inputs)
        flits0 = sum(sim[f"flits__{u}"] for u in range(P))
        self.loaded = True
        sim["start"] = 1
        sim.step()
        sim["start"] = 0
        sim.step(16)
        waited = 0
        # every engine has run (``cycles`` restarts at 0 with START and counts while busy):
        # a hash-flow engine starts only once its placer has put every gradient in
        while sim["busy"] or not all(sim[f"cycles__{u}"] for u in range(P)):
            sim.step(64)
            waited += 64
            if waited > max_cycles:
                raise TimeoutError(f"sparse fabric still busy after {waited} cycles "
                                   f"(busy mask {sim['busy']:#x})")
        cycles = max(sim[f"cycles__{u}"] for u in range(P))
        flits = sum(sim[f"flits__{u}"] for u in range(P)) - flits0
        finals = [sim[f"finals__{u}"] for u in range(P)]
        dump = self.program.dump_words
        out = sim.run_streams(inputs={f"host_i__{u}": [dump_request(self.program)]
                                      for u in range(P)},
                              outputs={f"host_o__{u}": dump + finals[u] + 1 for u in range(P)})
        res = np.zeros((P, N), np.float32)
        resid = np.zeros((P, N), np.float32)
        for u in range(P):
            w = out.outputs[f"host_o__{u}"]
            words = [int(a) | int(b) << 32 | int(c) << 64 for a, b, c in w[:-1, :3]]
            resid[u], res[u] = decode_program_dump(words, self.program)
        bad = sum(sim[f"malformed__{u}"] for u in range(P))
        return SparseRun(res, resid, int(cycles), int(bad), 8 * int(flits))

    def run_checked(self, grads: np.ndarray) -> SparseRun:
        """:meth:`run` and one golden step on the same gradients; ``bit_exact`` compares
        every node's result and residual bit for bit."""
        r = self.run(grads)
        want = self.golden.step(np.asarray(grads, np.float32))
        r.bit_exact = bool(np.array_equal(r.results.view(np.uint32),
                                          want.result.view(np.uint32)) and
                           np.array_equal(r.residuals.view(np.uint32),
                                          want.residuals.view(np.uint32)))
        return r
