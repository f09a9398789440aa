"""Amaranth-simulator unit tests of the order-preserving reduction engine."""
import numpy as np
import pytest
from amaranth.sim import Simulator

from treenic.hdl.fp32 import fp32_add_golden
from treenic.hdl.reduce import (ReduceEngine, reduce_engine_golden, reduce_golden,
                                random_reduce_traffic, reduction_order)


def test_reduction_order_sorts_by_step_then_port():
    assert reduction_order([(2, 0), (1, 3), (1, 1), (2, 2)]) == [1, 3, 0, 2]


def test_reduce_golden_is_a_left_fold_not_a_tree():
    # 1 + 2^-24 + 2^-24: left fold rounds twice to 1.0, (2^-24 + 2^-24) + 1 does not
    one, tiny = 0x3F800000, 0x33800000
    assert reduce_golden([one], [[tiny], [tiny]])[0] == one
    assert fp32_add_golden(fp32_add_golden(tiny, tiny), one) != one


def test_engine_golden_validates_messages():
    with pytest.raises(ValueError):
        reduce_engine_golden([(2, [0])], [(0, 1), (1, 2)], {0: [(0, 1), (0, 2)]})


def make_traffic(rng, P, D, n_cmds, *, allow_repeat=True):
    return random_reduce_traffic(rng, P, D, n_cmds, allow_repeat=allow_repeat)


def run_engine(P, D, fifo_depth, commands, local, ports, *, seed=0, p_valid=0.6, p_ready=0.6,
               skew=20, bad_cmd=None):
    dut = ReduceEngine(ports=P, depth=D, fifo_depth=fifo_depth)
    rng = np.random.default_rng(seed)
    results = []
    total_out = sum(s for s, _ in commands)

    def stream_producer(port, items, delay):
        async def proc(ctx):
            await ctx.tick().repeat(delay + 1)
            for idx, v in items:
                while rng.random() > p_valid:
                    ctx.set(port.valid, 0)
                    await ctx.tick()
                ctx.set(port.payload.index, idx)
                ctx.set(port.payload.value, v)
                ctx.set(port.valid, 1)
                await ctx.tick().until(port.ready)
            ctx.set(port.valid, 0)
        return proc

    async def cmd_producer(ctx):
        for size, order in commands:
            ctx.set(dut.cmd.payload.size, size)
            ctx.set(dut.cmd.payload.count, len(order))
            for q in range(P):
                ctx.set(dut.cmd.payload.order[q], order[q] if q < len(order) else 0)
            ctx.set(dut.cmd.valid, 1)
            await ctx.tick().until(dut.cmd.ready)
        ctx.set(dut.cmd.valid, 0)

    async def consumer(ctx):
        while len(results) < total_out:
            r = int(rng.random() < p_ready)
            ctx.set(dut.result.ready, r)
            _, _, valid, idx, val, err = await ctx.tick().sample(
                dut.result.valid, dut.result.payload.index, dut.result.payload.value,
                dut.error)
            assert not err
            if valid and r:
                results.append((idx, val))
        ctx.set(dut.result.ready, 0)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(cmd_producer)
    sim.add_testbench(stream_producer(dut.local, local, int(rng.integers(skew + 1))))
    for p in range(P):
        sim.add_testbench(stream_producer(dut.contrib[p], ports[p], int(rng.integers(skew + 1))))
    sim.add_testbench(consumer)
    sim.run_until(2e-8 * (len(local) + sum(map(len, ports.values())) + total_out) * 8 + 1e-5)
    return results


@pytest.mark.parametrize("seed", [1, 2])
def test_engine_matches_golden_with_skew_and_stalls(seed):
    rng = np.random.default_rng(seed)
    P, D = 3, 12
    commands, local, ports = make_traffic(rng, P, D, 5)
    got = run_engine(P, D, 4, commands, local, ports, seed=seed, skew=40)
    exp = reduce_engine_golden(commands, local, ports)
    flat = [(i, int(v)) for chunk in exp for i, v in enumerate(chunk.tolist())]
    assert got == flat


def test_engine_simultaneous_arrivals_full_rate():
    """All ports valid every cycle from the start: order still ascending by plan."""
    rng = np.random.default_rng(9)
    P, D = 4, 16
    commands, local, ports = make_traffic(rng, P, D, 3, allow_repeat=False)
    got = run_engine(P, D, 2, commands, local, ports, p_valid=1.0, p_ready=1.0, skew=0)
    exp = reduce_engine_golden(commands, local, ports)
    assert got == [(i, int(v)) for c in exp for i, v in enumerate(c.tolist())]


def test_engine_rejects_oversized_command():
    dut = ReduceEngine(ports=2, depth=8, fifo_depth=2)

    async def bench(ctx):
        ctx.set(dut.cmd.payload.size, 9)
        ctx.set(dut.cmd.payload.count, 1)
        ctx.set(dut.cmd.valid, 1)
        await ctx.tick()
        ctx.set(dut.cmd.valid, 0)
        await ctx.tick()
        assert ctx.get(dut.error) == 1
        assert ctx.get(dut.busy) == 0          # dropped, engine still idle
        assert ctx.get(dut.local.ready) == 0

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
