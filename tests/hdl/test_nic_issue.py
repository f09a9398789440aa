"""Issue (hdl/nic/issue.py) with the schedule-table RAM: the issue rules the golden model
states (hdl/nic/model.py ``port_messages``: REDUCE sends to the parent port, GATHER to
every child port, in table order; a REDUCE waits for its children's contributions), with
random TX busy time; a NOP holds its step for LOCKSTEP cycles (step log); DONE once every
entry is retired; a too-large ENTRIES fails at START."""
import random

import pytest
from amaranth.hdl import Elaboratable, Module
from amaranth.lib import memory

from treenic.hdl.nic import NicParams
from treenic.hdl.nic.issue import Issue

from nic_unit_helpers import simulate

P = NicParams(ports=2, depth=32, max_nodes=4, max_entries=16, max_steps=8)


class IssueTop(Elaboratable):
    """Issue with the schedule-table RAM (read port as in the NIC) preloaded with rows."""

    def __init__(self, rows):
        self.issue, self.rows = Issue(params=P), rows

    def elaborate(self, platform):
        m = Module()
        m.submodules.issue = iss = self.issue
        m.submodules.table = t = memory.Memory(shape=P.row_words * 32, depth=P.max_entries,
                                               init=self.rows)
        rd = t.read_port()
        m.d.comb += [rd.addr.eq(iss.row_addr), iss.row_data.eq(rd.data)]
        return m


def run_issue(rows, *, lockstep=0, expect=(), busy=(1, 6), seed=1, entries=None):
    top = IssueTop(rows)
    iss = top.issue
    rnd = random.Random(seed)
    log = {"go": [], "steplog": {}}

    async def tb(ctx):
        ctx.set(iss.entries, len(rows) if entries is None else entries)
        ctx.set(iss.lockstep, lockstep)
        for f, ports in expect:
            ctx.set(iss.tables.expect[f], ports)
        ctx.set(iss.tx_idle, (1 << P.ports) - 1)
        ctx.set(iss.start, 1)
        await ctx.tick()
        ctx.set(iss.start, 0)
        busy_until = [0] * P.ports
        for c in range(3000):
            # the scan is a separate unit: finish at once, good
            ctx.set(iss.scan_finished, 1)
            idle = sum(1 << q for q in range(P.ports) if c >= busy_until[q])
            ctx.set(iss.tx_idle, idle)
            go = ctx.get(iss.tx_go)
            if go:
                log["go"].append((c, go, ctx.get(iss.tx_desc.flow), ctx.get(iss.tx_desc.op),
                                  ctx.get(iss.timestep)))
                for q in range(P.ports):
                    if go >> q & 1:
                        busy_until[q] = c + 1 + rnd.randrange(*busy)
            if ctx.get(iss.steplog_en):
                log["steplog"][ctx.get(iss.steplog_addr)] = ctx.get(iss.steplog_data)
            if c == 50:                   # the children's contributions arrive
                for q in range(P.ports):
                    ctx.set(iss.reduce_done[q], (1 << P.max_nodes) - 1)
            await ctx.tick()
            if ctx.get(iss.done) or ctx.get(iss.scan_failed):
                break
        log.update(done=ctx.get(iss.done), failed=ctx.get(iss.scan_failed),
                   ev=ctx.get(iss.ev_table_index), cycles=c, ts=ctx.get(iss.timestep))

    simulate(top, tb)
    return log


def row(op, flow, step, pport, cports, start, size):
    return P.encode_row(op, flow, step, pport, cports, start, size)


def test_issue_order_lockstep_and_dependencies():
    L = 30
    rows = [row(0, 0, 1, None, [], 0, 0),            # NOP: hold step 1 for L cycles
            row(1, 1, 2, 1, [0], 0, 8),              # REDUCE flow 1 to port 1, child port 0
            row(2, 2, 2, None, [0, 1], 8, 8),        # GATHER flow 2 (root) to ports 0 and 1
            row(1, 3, 3, 0, [], 16, 4)]              # REDUCE flow 3 (leaf) to port 0
    log = run_issue(rows, lockstep=L, expect=[(1, 0b01)])
    assert log["done"] and not log["failed"]
    go = [(ports, flow, op) for _, ports, flow, op, _ in log["go"]]
    assert go == [(0b10, 1, 1), (0b11, 2, 2), (0b01, 3, 1)]
    first = log["go"][0][0]
    assert first >= 50 and log["steplog"][1] >= L   # waited for the child and the lockstep
    steps = [ts for *_, ts in log["go"]]
    assert steps == [2, 2, 3] and log["ts"] == 3


def test_issue_entries_beyond_table_fail_at_start():
    log = run_issue([row(0, 0, 1, None, [], 0, 0)], entries=P.max_entries + 1)
    assert log["failed"] and not log["done"] and log["go"] == []


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_issue_rejects_bad_params():
    with pytest.raises(TypeError):
        Issue(params={"ports": 2})
