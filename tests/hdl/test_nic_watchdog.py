"""NIC watchdog (hdl/nic/watchdog.py) in the Amaranth simulator: fires after exactly
``limit`` cycles without progress, never with progress or limit 0, once per run, and
latches the cause the golden function names (random inputs)."""
import random

from amaranth.sim import Simulator

from treenic.hdl.nic.params import NicParams
from treenic.hdl.nic.watchdog import Watchdog, WdCause, decode_info, golden_info

P = NicParams(ports=4, max_nodes=4, depth=64)


def run(body, cycles=400):
    dut = Watchdog(params=P)
    out = {}

    async def tb(ctx):
        await body(ctx, dut, out)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run_until(1e-8 * cycles)
    return out


async def cycles_to_fire(ctx, dut, limit, progress_every=None, max_cycles=200):
    ctx.set(dut.limit, limit)
    ctx.set(dut.running, 1)
    for n in range(max_cycles):
        ctx.set(dut.progress, progress_every is not None and n % progress_every == 0)
        await ctx.tick()
        if ctx.get(dut.fire):
            return n + 1          # clock edges since the last progress
    return None


def test_fires_after_limit_only_without_progress():
    async def body(ctx, dut, out):
        out["off"] = await cycles_to_fire(ctx, dut, 0)
        out["busy"] = await cycles_to_fire(ctx, dut, 20, progress_every=10)
        ctx.set(dut.running, 0)
        await ctx.tick().repeat(2)
        out["idle"] = await cycles_to_fire(ctx, dut, 20)
        out["again"] = await cycles_to_fire(ctx, dut, 20, max_cycles=60)   # once per run
        ctx.set(dut.limit, 7)             # (the host writes the limit before START)
        ctx.set(dut.running, 0)
        await ctx.tick().repeat(2)
        out["rearmed"] = await cycles_to_fire(ctx, dut, 7)
    out = run(body, 1000)
    assert out["off"] is None and out["busy"] is None and out["again"] is None
    # reloaded while not running, counts down limit cycles, then fires
    assert out["idle"] == 20 and out["rearmed"] == 7


def test_cause_matches_golden_on_random_inputs():
    rng = random.Random(9)
    F, Pn = P.max_nodes, P.ports
    cases = []
    for _ in range(25):
        c = dict(tx_busy=rng.choice([0, 0, rng.randrange(16)]),
                 tx_flow=[rng.randrange(F) for _ in range(Pn)],
                 tx_step=[rng.randrange(P.max_steps) for _ in range(Pn)],
                 head_valid=rng.random() < 0.5, head_gather=rng.random() < 0.5,
                 head_flow=rng.randrange(F), head_step=rng.randrange(P.max_steps),
                 head_owed=rng.choice([0, rng.randrange(16)]),
                 owed_red=[rng.choice([0, 0, rng.randrange(16)]) for _ in range(F)],
                 owed_gat=[rng.choice([0, 0, rng.randrange(16)]) for _ in range(F)],
                 timestep=rng.randrange(P.max_steps))
        cases.append(c)

    async def body(ctx, dut, out):
        got = []
        for c in cases:
            for k in ("tx_busy", "head_valid", "head_gather", "head_flow", "head_step",
                      "head_owed", "timestep"):
                ctx.set(getattr(dut, k), int(c[k]))
            for i in range(Pn):
                ctx.set(dut.tx_flow[i], c["tx_flow"][i])
                ctx.set(dut.tx_step[i], c["tx_step"][i])
            for f in range(F):
                ctx.set(dut.owed_red[f], c["owed_red"][f])
                ctx.set(dut.owed_gat[f], c["owed_gat"][f])
            ctx.set(dut.limit, 3)         # the host writes the limit before START
            await ctx.tick()
            await cycles_to_fire(ctx, dut, 3)
            await ctx.tick()
            got.append(ctx.get(dut.info))
            ctx.set(dut.clear, 1)
            await ctx.tick()
            ctx.set(dut.clear, 0)
        out["got"] = got
    out = run(body, 25 * 13 + 50)
    assert out["got"] == [golden_info(**c) for c in cases]
    kinds = {decode_info(w)["cause"] for w in out["got"]}
    assert {"CREDIT", "CONTRIB", "GATHER"} <= kinds


def test_decode_info_names_fields():
    w = golden_info(tx_busy=0b100, tx_flow=[0, 0, 5, 0], tx_step=[0, 0, 9, 0])
    assert decode_info(w) == {"fired": True, "cause": WdCause.CREDIT.name, "port": 2,
                              "flow": 5, "step": 9}
