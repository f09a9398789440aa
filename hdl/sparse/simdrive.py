"""Amaranth-simulator stream driver used by the sparse-unit tests and the benchmark.

:func:`run_stream_unit` offers packed integer payloads on one input stream with random
valid gaps, accepts an output stream with random backpressure, and returns the collected
payloads (as packed integers) and the cycle count. Payloads are packed integers so one
driver serves every layout (``View.as_value()`` is the flat bit vector).
"""
from __future__ import annotations

import random

from amaranth.sim import Simulator


def run_stream_unit(dut, inputs, *, n_out=None, i="i", o="o", p_valid=1.0, p_ready=1.0,
                    seed=0, setup=None, max_cycles=None, until=None):
    """Drive ``dut.<i>`` with ``inputs`` (ints) and collect ``dut.<o>`` payloads.

    ``n_out``: items to collect (default ``len(inputs)``); ``until(word)``: stop after the
    first output transfer for which it is true instead. ``setup(ctx)``: sets configuration
    ports before the first cycle. Returns ``(outputs, cycles)``, where cycles counts from the
    first offered input to the last output transfer."""
    rng = random.Random(seed)
    si, so = getattr(dut, i), getattr(dut, o)
    out, state = [], {"cycles": 0}
    n_out = len(inputs) if n_out is None else n_out
    limit = max_cycles or 50 * (len(inputs) + n_out) + 10_000

    async def producer(ctx):
        if setup:
            setup(ctx)
        for word in inputs:
            while rng.random() >= p_valid:
                ctx.set(si.valid, 0)
                await ctx.tick()
            ctx.set(si.payload.as_value() if hasattr(si.payload, "as_value") else si.payload,
                    word)
            ctx.set(si.valid, 1)
            await ctx.tick().until(si.ready)
        ctx.set(si.valid, 0)

    async def consumer(ctx):
        payload = so.payload.as_value() if hasattr(so.payload, "as_value") else so.payload
        cycles = 0
        while True:
            ready = int(rng.random() < p_ready)
            ctx.set(so.ready, ready)
            _, _, valid, word = await ctx.tick().sample(so.valid, payload)
            cycles += 1
            if valid and ready:
                out.append(word)
                if (until(word) if until else len(out) >= n_out):
                    break
            if cycles > limit:
                raise TimeoutError(f"{type(dut).__name__}: {len(out)} outputs after {cycles} cycles")
        state["cycles"] = cycles

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(producer, background=True)
    sim.add_testbench(consumer)
    sim.run()
    return out, state["cycles"]


def pack(values, width):
    """Pack a sequence of unsigned ints, element 0 in the low bits."""
    word = 0
    for n, v in enumerate(values):
        word |= (int(v) & ((1 << width) - 1)) << (n * width)
    return word


def unpack(word, width, count):
    mask = (1 << width) - 1
    return [(word >> (n * width)) & mask for n in range(count)]


async def send_words(ctx, stream, words) -> None:
    """Offer ``words`` (packed ints) on ``stream`` back to back, each held until ``ready``;
    ``valid`` is low afterwards. For testbenches that sequence commands on a stream."""
    for w in words:
        ctx.set(stream.payload.as_value(), w)
        ctx.set(stream.valid, 1)
        await ctx.tick().until(stream.ready)
    ctx.set(stream.valid, 0)


async def drive_flits(ctx, channel, flits, *, stall: float = 0.0, seed: int = 0) -> None:
    """Put ``flits`` (packed ints) on a link channel, one per cycle (a link channel has no
    ready: the receiver's credits bound what a sender may put there); with ``stall``, each
    cycle is idle with that probability instead (a stalled link, random with ``seed``)."""
    rng = random.Random(seed)
    for f in flits:
        while rng.random() < stall:
            ctx.set(channel.valid, 0)
            await ctx.tick()
        ctx.set(channel.flit.as_value(), f)
        ctx.set(channel.valid, 1)
        await ctx.tick()
    ctx.set(channel.valid, 0)


def run_with_link(dut, host, flits, *, port: int = 0, stall: float = 0.0, seed: int = 0) -> None:
    """Simulate ``dut`` (100 MHz) with the testbench ``host`` while ``flits`` arrive on its
    link receive port ``port`` in the background (``stall``, ``seed``: see
    :func:`drive_flits`); returns when ``host`` does."""
    async def link(ctx):
        await drive_flits(ctx, dut.rx[port], flits, stall=stall, seed=seed)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(host)
    sim.add_testbench(link, background=True)
    sim.run()
