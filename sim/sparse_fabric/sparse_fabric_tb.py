"""cocotb bench of the sparse NIC fabric (``treenic.hdl.nic.sparse_fabric``): every node's
program and gradients through its host stream, one fabric-wide start, the dump of every
node compared bit for bit (results AND residuals) with the golden model
(``treenic.sparse.multitree_sparse`` with either residual, or ``topk_family.TopkA``) over
several error-feedback iterations; the links stall at random (LFSR in each link)."""
import cocotb
import numpy as np
from cocotb.triggers import RisingEdge

from harness import bench_params, start_clock_and_reset
from treenic.hdl.nic.sparse_fabric import decode_program_dump, dump_request, load_words
from treenic.hdl.nic.sparse_sim import imaged_model


def _init(dut, P):
    dut.start.value = 0
    for u in range(P):
        getattr(dut, f"host_i__{u}__valid").value = 0
        getattr(dut, f"host_o__{u}__ready").value = 0


async def _send(dut, u, words):
    valid, payload = getattr(dut, f"host_i__{u}__valid"), getattr(dut, f"host_i__{u}__payload")
    ready = getattr(dut, f"host_i__{u}__ready")
    for w in words:
        payload.value = w
        valid.value = 1
        await RisingEdge(dut.clk)
        while not ready.value:
            await RisingEdge(dut.clk)
    valid.value = 0


async def _dump(dut, u, prog):
    await _send(dut, u, [dump_request(prog)])
    valid, payload = getattr(dut, f"host_o__{u}__valid"), getattr(dut, f"host_o__{u}__payload")
    getattr(dut, f"host_o__{u}__ready").value = 1
    words = []
    while True:
        await RisingEdge(dut.clk)
        if valid.value:
            w = int(payload.value)
            if w >> 65 & 1:
                break
            words.append(w)
    getattr(dut, f"host_o__{u}__ready").value = 0
    return words


@cocotb.test()
async def multitree_sparse_iterations(dut):
    p = bench_params()
    P, N = p["workers"], p["elements"]
    # the rows the host loads come from the configuration image (built, serialized, decoded)
    golden, _, prog = imaged_model(p.get("algorithm", "multitree-sparse"), p["topology"], N,
                                   p["density"], seed=p["seed"],
                                   flow_assignment=p["flow_assignment"],
                                   residual=p.get("residual", "local"))
    rng = np.random.default_rng(p["seed"])
    await start_clock_and_reset(dut, init=lambda d: _init(d, P))
    for it in range(p["iterations"]):
        g = rng.standard_normal((P, N)).astype(np.float32)
        loads = [cocotb.start_soon(_send(dut, u, load_words(prog, u, g[u])[
            (0 if it == 0 else len(prog.rows[u])):])) for u in range(P)]
        for t in loads:
            await t
        dut.start.value = 1
        await RisingEdge(dut.clk)
        dut.start.value = 0
        for _ in range(16):
            await RisingEdge(dut.clk)
        cycles = 0
        # until every engine has run (a hash-flow engine starts once its placer is empty)
        while int(dut.busy.value) or not all(int(getattr(dut, f"cycles__{u}").value)
                                             for u in range(P)):
            await RisingEdge(dut.clk)
            cycles += 1
            assert cycles < 200_000, "sparse fabric did not finish"
        want = golden.step(g)
        for u in range(P):
            resid, res = decode_program_dump(await _dump(dut, u, prog), prog)
            assert np.array_equal(res.view(np.uint32), want.result[u].view(np.uint32)), \
                f"iteration {it} node {u}: result differs from the golden"
            assert np.array_equal(resid.view(np.uint32), want.residuals[u].view(np.uint32)), \
                f"iteration {it} node {u}: residual differs from the golden"
            assert int(getattr(dut, f"malformed__{u}").value) == 0
        dut._log.info(f"iteration {it}: bit-exact on {P} nodes")
