"""cocotb stream driver shared by the sparse-unit benches (``sim/sparse_*``).

:func:`drive_collect` offers packed integer payloads on ``<i>__payload``/``<i>__valid`` with
random valid gaps and accepts ``<o>`` with random backpressure, in one coroutine (no
ordering races between a producer and a consumer); it returns the collected payloads."""
from cocotb.triggers import ReadOnly, RisingEdge


def init_streams(dut, *, i="i", o="o"):
    getattr(dut, f"{i}__valid").value = 0
    getattr(dut, f"{i}__payload").value = 0
    getattr(dut, f"{o}__ready").value = 0


async def drive_collect(dut, words, *, rng, p_valid, p_ready, i="i", o="o", n_out=None,
                        until=None, max_cycles=None):
    """Returns ``(outputs, cycles)``; ``until(word)`` true stops after that output."""
    iv, ip, ir = (getattr(dut, f"{i}__{f}") for f in ("valid", "payload", "ready"))
    ov, op, orr = (getattr(dut, f"{o}__{f}") for f in ("valid", "payload", "ready"))
    n_out = len(words) if n_out is None else n_out
    limit = max_cycles or 50 * (len(words) + n_out) + 10_000
    sent, out, cycles, offering = 0, [], 0, False
    while True:
        if not offering and sent < len(words) and rng.random() < p_valid:
            offering = True
            ip.value = int(words[sent])
        iv.value = int(offering)
        ready = int(rng.random() < p_ready)
        orr.value = ready
        await ReadOnly()
        if offering and int(ir.value):
            sent += 1
            offering = False
        done = False
        if ready and int(ov.value):
            out.append(int(op.value))
            done = until(out[-1]) if until else len(out) >= n_out
        await RisingEdge(dut.clk)
        cycles += 1
        if done:
            break
        assert cycles < limit, f"stuck: sent {sent}/{len(words)}, got {len(out)} after {cycles} cycles"
    iv.value = 0
    orr.value = 0
    return out, cycles
