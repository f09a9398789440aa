"""The network model vectorised over nodes, for schedules whose links are private.

When every transfer goes to a one-hop neighbour of a direct network (MultiTree, Ring and
2D-Ring on tori and meshes), each directed link has one sender and every dependency of a
step-``s`` entry was sent in an earlier step. The event loop of :mod:`.sim` then reduces to
a sweep: step by step, and within a step by the entry's rank in its node's table, every
node's entry is issued at once with numpy. Same tables (built here from the transfer arrays
in the order :func:`treenic.schedule.table.node_entries` gives — a test checks them entry
for entry), same issue rules, same times as the event loop (a test checks the cycles).

This is what makes a 1024-node torus with two million transfers take seconds.
"""
from __future__ import annotations

import math
import time
from operator import attrgetter, itemgetter

import numpy as np

from treenic.schedule.ir import Op, Schedule

from .timing import NicTiming, message_flits

__all__ = ["applies", "EntryArrays", "entry_arrays", "sweep"]

NOP, RETIRE, SEND = 0, 1, 2


def applies(schedule: Schedule) -> bool:
    """True when every transfer is one hop on a direct network (links are private)."""
    topo = schedule.topology
    if not topo.is_direct or any(t.route is not None and len(t.route) != 2
                                 for t in schedule.transfers):
        return False
    _, src, dst, _, _ = _rows(schedule)
    n = schedule.n
    edges = np.array(sorted({u * n + v for u, v in topo.graph.edges() if u != v}), np.int64)
    return bool(np.isin(src * n + dst, edges).all())


def _rows(schedule: Schedule):
    """Transfers expanded per chunk: (step, src, dst, op, chunk) int64 arrays (cached on
    the schedule object: schedules are not modified after they are built)."""
    cached = schedule.__dict__.get("_netsim_rows")
    if cached is not None and cached[0] == len(schedule.transfers):
        return cached[1]
    tr = schedule.transfers
    m = len(tr)
    col = lambda f, it=None: np.fromiter(map(f, tr if it is None else it), np.int64, m)  # noqa
    st, sr, ds = col(attrgetter("step")), col(attrgetter("src")), col(attrgetter("dst"))
    op = col(attrgetter("op"))
    chunks = list(map(attrgetter("chunks"), tr))
    nchunks = col(len, chunks)
    if (nchunks == 1).all():
        ch = col(itemgetter(0), chunks)
    else:                          # a transfer carrying several chunks: one row per chunk
        ch = np.fromiter((c for t in tr for c in t.chunks), np.int64, int(nchunks.sum()))
        st, sr, ds, op = (np.repeat(a, nchunks) for a in (st, sr, ds, op))
    rows = (st, sr, ds, op, ch)
    schedule.__dict__["_netsim_rows"] = (m, rows)
    return rows


class EntryArrays:
    """Every node's table as arrays, sorted by (node, step, op, flow).

    Members
    -------
    node, step, op, flow, kind, size: per entry.
    dep_entry, dep_row: dependency pairs (entry waits for transfer row ``dep_row``);
    dep_gated: the pair is a REDUCE contribution, accumulated in the order gate's order.
    send_entry, send_row: sends (entry sends transfer row ``send_row``).
    rows: (step, src, dst, op, chunk) per transfer row.
    """


def entry_arrays(schedule: Schedule, elements: int) -> EntryArrays:
    n, C, S = schedule.n, schedule.num_chunks, schedule.steps
    st, sr, ds, op, ch = _rows(schedule)
    bounds = schedule.chunk_bounds(elements)
    sizes = (bounds[1:] - bounds[:-1]).astype(np.int64)
    R, G = op == int(Op.REDUCE), op == int(Op.GATHER)
    nc = lambda u, c: u * C + c                                    # noqa: E731
    # REDUCE: one send entry per red-out row; the root (red-in, no red-out) retires at its
    # last arrival step
    red_out = np.flatnonzero(R)
    has_out = np.zeros(n * C, bool)
    has_out[nc(sr[red_out], ch[red_out])] = True
    red_in = np.flatnonzero(R)
    root_key = nc(ds[red_in], ch[red_in])
    root_mask = ~has_out[root_key]
    root_last = np.full(n * C, -1, np.int64)
    np.maximum.at(root_last, root_key[root_mask], st[red_in][root_mask])
    roots = np.flatnonzero(root_last >= 0)
    # GATHER: one send entry per (src, chunk, step) group; receive-only where no gather out
    g_rows = np.flatnonzero(G)
    gkey = (nc(sr[g_rows], ch[g_rows])) * (S + 1) + st[g_rows]
    gk_unique, g_group = np.unique(gkey, return_inverse=True)
    g_has_out = np.zeros(n * C, bool)
    g_has_out[gk_unique // (S + 1)] = True
    g_in_key = nc(ds[g_rows], ch[g_rows])
    recv_only = ~g_has_out[g_in_key]
    # entry table: node, step, op, flow, kind
    e_node = [sr[red_out], roots // C, gk_unique // (S + 1) // C, ds[g_rows][recv_only]]
    e_step = [st[red_out], root_last[roots], gk_unique % (S + 1), st[g_rows][recv_only]]
    e_op = [np.full(len(red_out), 1), np.full(len(roots), 1), np.full(len(gk_unique), 2),
            np.full(int(recv_only.sum()), 2)]
    e_flow = [ch[red_out], roots % C, gk_unique // (S + 1) % C, ch[g_rows][recv_only]]
    e_kind = [np.full(len(red_out), SEND), np.full(len(roots), RETIRE),
              np.full(len(gk_unique), SEND), np.full(int(recv_only.sum()), RETIRE)]
    node, step = np.concatenate(e_node), np.concatenate(e_step)
    busy = np.zeros((n, S + 1), bool)
    busy[node, step] = True
    nop_u, nop_s = np.nonzero(~busy[:, 1:])
    k_nop = len(nop_u)
    node = np.concatenate([node, nop_u])
    step = np.concatenate([step, nop_s + 1])
    eop = np.concatenate(e_op + [np.zeros(k_nop, np.int64)])
    flow = np.concatenate(e_flow + [np.zeros(k_nop, np.int64)])
    kind = np.concatenate(e_kind + [np.full(k_nop, NOP)])
    size = np.where(kind == NOP, 0, sizes[flow])
    kind = np.where((kind == SEND) & (size == 0), RETIRE, kind)
    # one int64 key (unique per entry) sorts faster than a four-key lexsort
    order = np.argsort(((node * (S + 1) + step) * 3 + eop) * C + flow)
    inv = np.empty_like(order)
    inv[order] = np.arange(len(order))
    ea = EntryArrays()
    ea.node, ea.step, ea.op, ea.flow = node[order], step[order], eop[order], flow[order]
    ea.kind, ea.size = kind[order], size[order]
    ea.rows = (st, sr, ds, op, ch)
    n_red, n_root = len(red_out), len(roots)
    red_entry = inv[np.arange(n_red)]                          # entry of each red-out row
    g_entry = inv[n_red + n_root + g_group]                    # entry of each gather row
    ea.send_entry = np.concatenate([red_entry, g_entry])
    ea.send_row = np.concatenate([red_out, g_rows])
    sending = ea.kind[ea.send_entry] == SEND        # empty chunks send nothing
    ea.send_entry, ea.send_row = ea.send_entry[sending], ea.send_row[sending]
    ea.dep_entry, ea.dep_row, ea.dep_gated = _deps(n, C, ea, st, sr, ds, ch, red_out, red_entry, g_rows,
                                     g_entry, gk_unique, S)
    return ea


def _deps(n, C, ea, st, sr, ds, ch, red_rows, red_entry, g_rows, g_entry, gk_unique, S):
    """(entry, row) pairs: a REDUCE send waits for the contributions into (node, chunk)
    that arrived at earlier steps; a GATHER send for the gather into (node, chunk), or at
    the root for every contribution."""
    red_send_of = np.full(n * C, -1, np.int64)                 # (u, c) -> its REDUCE entry
    red_send_of[sr[red_rows] * C + ch[red_rows]] = red_entry
    in_key = ds[red_rows] * C + ch[red_rows]
    cons = red_send_of[in_key]
    ok = (cons >= 0) & (st[red_rows] < np.where(cons >= 0, ea.step[np.maximum(cons, 0)], 0))
    pairs_e, pairs_r = [cons[ok]], [red_rows[ok]]
    gated = [np.ones(int(ok.sum()), bool)]
    # GATHER sends: group entries per (u, c)
    g_ent_uc = gk_unique // (S + 1)
    # entry ids of gather groups, in gk_unique order
    grp_entry = np.empty(len(gk_unique), np.int64)
    grp_entry[np.searchsorted(gk_unique, (sr[g_rows] * C + ch[g_rows]) * (S + 1) + st[g_rows])] \
        = g_entry
    # parent gather row into (u, c) -> every gather group of (u, c)
    gin_of = np.full(n * C, -1, np.int64)
    gin_of[ds[g_rows] * C + ch[g_rows]] = g_rows
    par = gin_of[g_ent_uc]
    has_par = par >= 0
    pairs_e.append(grp_entry[has_par])
    pairs_r.append(par[has_par])
    gated.append(np.zeros(int(has_par.sum()), bool))
    # roots: every contribution into (u, c)
    root_groups = np.flatnonzero(~has_par)
    if len(root_groups):
        order = np.argsort(in_key, kind="stable")
        keys_sorted = in_key[order]
        uc = g_ent_uc[root_groups]
        lo = np.searchsorted(keys_sorted, uc, "left")
        hi = np.searchsorted(keys_sorted, uc, "right")
        cnt = hi - lo
        rep = np.repeat(np.arange(len(root_groups)), cnt)
        idx = np.concatenate([np.arange(a, b) for a, b in zip(lo, hi)]) if cnt.sum() \
            else np.zeros(0, np.int64)
        pairs_e.append(grp_entry[root_groups][rep])
        pairs_r.append(red_rows[order][idx])
        gated.append(np.ones(len(rep), bool))
    return np.concatenate(pairs_e), np.concatenate(pairs_r), np.concatenate(gated)


def _row_links(schedule: Schedule, links, src, dst):
    """Per transfer row: the sender's port, cycles per flit and latency of its link."""
    topo = schedule.topology
    pair = src * schedule.n + dst
    uniq, inv = np.unique(pair, return_inverse=True)
    port = np.empty(len(uniq), np.int64)
    cpf = np.empty(len(uniq))
    lat = np.empty(len(uniq))
    for i, pr in enumerate(uniq.tolist()):
        u, v = divmod(pr, schedule.n)
        port[i] = topo.port_to(u, v)
        cpf[i], lat[i] = links.cpf[(u, v)], links.lat[(u, v)]
    return port[inv], cpf[inv], lat[inv]


def _rx_ports(schedule: Schedule, src, dst):
    """Per transfer row: the receiver's port of the link from the sender."""
    pair = dst * schedule.n + src
    uniq, inv = np.unique(pair, return_inverse=True)
    port = np.array([schedule.topology.port_to(*divmod(int(p), schedule.n)) for p in uniq],
                    np.int64)
    return port[inv]


def _groups(keys):
    """Boundaries of runs of equal values in a sorted key array."""
    if len(keys) == 0:
        return np.zeros(1, np.int64)
    cut = np.flatnonzero(np.diff(keys)) + 1
    return np.concatenate([[0], cut, [len(keys)]])


def sweep(schedule: Schedule, elements: int, timing: NicTiming, lockstep: int, links,
          ea: EntryArrays | None = None) -> dict:
    """Run the model step by step over all nodes at once; returns the fields of a
    :class:`~.sim.SimResult` (cycles, node_done, step_cycles_node0, counts)."""
    t0 = time.perf_counter()
    ea = ea if ea is not None else entry_arrays(schedule, elements)
    n, t = schedule.n, timing
    st, sr, ds, op, ch = ea.rows
    port, cpf, lat = _row_links(schedule, links, sr, ds)
    words, winv = np.unique(ea.size[ea.send_entry], return_inverse=True)
    fl = np.array([message_flits(int(w), t) for w in words], np.int64).reshape(-1, 2)
    row_flits = fl[winv, 0].astype(np.float64)
    heads = int(fl[winv, 1].sum())
    # rank of each entry in its (node, step) group, processing order (step, rank, node)
    ne = len(ea.node)
    ns_key = ea.node * (schedule.steps + 1) + ea.step
    starts = _groups(ns_key)
    rank = np.arange(ne) - np.repeat(starts[:-1], np.diff(starts))
    gkey = ea.step * (int(rank.max()) + 1 if ne else 1) + rank
    order = np.argsort(gkey * n + ea.node)
    bounds = _groups(gkey[order])
    grp_of_entry = np.empty(ne, np.int64)
    grp_of_entry[order] = np.repeat(np.arange(len(bounds) - 1), np.diff(bounds))
    g = ea.dep_gated
    d_ord = np.argsort(grp_of_entry[ea.dep_entry[~g]], kind="stable")
    dep_e, dep_r = ea.dep_entry[~g][d_ord], ea.dep_row[~g][d_ord]
    d_b = np.searchsorted(grp_of_entry[dep_e], np.arange(len(bounds)))
    # gated pairs in (group, rank in the entry's contract order, entry) order
    ge, gr = ea.dep_entry[g], ea.dep_row[g]
    rxp = _rx_ports(schedule, sr[gr], ds[gr]) if len(gr) else gr
    P = schedule.topology.max_ports() + 1
    o = np.argsort((ge * (schedule.steps + 1) + st[gr]) * P + rxp)
    ge, gr = ge[o], gr[o]
    first = _groups(ge)
    grank = np.arange(len(ge)) - np.repeat(first[:-1], np.diff(first))
    o = np.argsort((grp_of_entry[ge] * (int(grank.max()) + 1 if len(grank) else 1) + grank)
                   * ne + ge)
    ge, gr, grank = ge[o], gr[o], grank[o]
    g_b = np.searchsorted(grp_of_entry[ge], np.arange(len(bounds)))
    s_ord = np.argsort(grp_of_entry[ea.send_entry], kind="stable")
    snd_e, snd_r = ea.send_entry[s_ord], ea.send_row[s_ord]
    snd_fl = row_flits[s_ord]
    s_b = np.searchsorted(grp_of_entry[snd_e], np.arange(len(bounds)))
    state = _State(n, schedule.topology.max_ports(), np.bincount(ea.node, minlength=n), t)
    arr_first = np.zeros(len(st))
    arr_full = np.zeros(len(st))
    steplog, cur_step = [], 1
    pos = np.zeros(ne, np.int64)
    for g in range(len(bounds) - 1):
        E = order[bounds[g]:bounds[g + 1]]
        s = int(ea.step[E[0]])
        while cur_step < s:                       # every node advances its timestep
            steplog.append(state.advance())
            cur_step += 1
        pe, pr = dep_e[d_b[g]:d_b[g + 1]], dep_r[d_b[g]:d_b[g + 1]]
        gated = (ge[g_b[g]:g_b[g + 1]], gr[g_b[g]:g_b[g + 1]], grank[g_b[g]:g_b[g + 1]])
        se, sw = snd_e[s_b[g]:s_b[g + 1]], snd_r[s_b[g]:s_b[g + 1]]
        state.group(E, ea.node[E], ea.kind[E], pos, pe, pr, gated, se, sw,
                    snd_fl[s_b[g]:s_b[g + 1]], port, cpf, lat, arr_first, arr_full, lockstep)
    last_rx = np.zeros(n)
    np.maximum.at(last_rx, ds, arr_full)
    done = np.maximum.reduce([state.head_ready, state.tx_idle.max(1) + 1, last_rx + 1])
    steplog.append(float(done[0] - state.step_start[0]))
    return {"cycles": float(done.max()) + t.done_cycles, "node_done": done.tolist(),
            "step_cycles_node0": steplog, "messages": len(st), "flits": int(row_flits.sum()),
            "head_flits": heads, "wall": time.perf_counter() - t0}


class _State:
    """Per-node NIC state of the sweep (arrays over nodes)."""

    def __init__(self, n, ports, entries_per_node, t: NicTiming):
        start = entries_per_node.astype(np.float64) + t.scan_overhead
        self.t = t
        self.head_ready = start + t.run_start
        self.lk_zero = start.copy()
        self.step_start = start.copy()
        self.tx_idle = np.repeat(start[:, None], max(1, ports), axis=1)

    def advance(self) -> float:
        a = np.maximum.reduce([self.head_ready, self.lk_zero, self.tx_idle.max(1) + 1])
        first = float(a[0] - self.step_start[0])
        self.step_start = a
        self.head_ready = a + self.t.due_cycles
        return first

    def group(self, E, u, kind, pos, pe, pr, gated, se, sw, sflits, port, cpf, lat,
              arr_first, arr_full, lockstep):
        """Issue one entry per node (entries ``E`` of nodes ``u``, all the same rank)."""
        t = self.t
        x = self.head_ready[u].copy()
        nop = kind == NOP
        if nop.any():
            self.lk_zero[u[nop]] = x[nop] + 1 + lockstep
        if len(se):
            pos[E] = np.arange(len(E))
            depf = np.zeros(len(E))
            depF = np.zeros(len(E))
            if len(pe):
                np.maximum.at(depf, pos[pe], arr_first[pr])
                np.maximum.at(depF, pos[pe], arr_full[pr])
            ge, gr, grank = gated
            if len(ge):                   # order gate: fold in contract order, rank by rank
                accf = np.full(len(E), -np.inf)
                accF = np.full(len(E), -np.inf)
                rb = _groups(grank)
                for a, b in zip(rb[:-1], rb[1:]):
                    p = pos[ge[a:b]]
                    accf[p] = np.maximum(arr_first[gr[a:b]], accf[p] + t.gate_lag)
                    accF[p] = np.maximum(arr_full[gr[a:b]], accF[p] + t.gate_lag)
                depf = np.maximum(depf, accf)
                depF = np.maximum(depF, accF)
            sp = pos[se]
            sport = port[sw]
            idle = np.zeros(len(E))
            np.maximum.at(idle, sp, self.tx_idle[u[sp], sport] + t.idle_cycles)
            send = kind == 2
            x[send] = np.maximum.reduce([x[send], depf[send] + t.dep_cycles, idle[send]])
            begin = x[sp] + t.start_cycles
            end = begin + sflits * cpf[sw]
            if t.forward == "cut-through":
                end = np.maximum(end, depF[sp] + t.start_cycles)
            self.tx_idle[u[sp], sport] = end + t.tx_tail
            full = end + lat[sw] + t.rx_done
            first = full
            if t.forward == "cut-through":
                sub = np.minimum(sflits, 1 + math.ceil(t.sub_words / t.lanes))
                first = np.minimum(full, begin + lat[sw] + sub * cpf[sw] + t.rx_done)
            arr_first[sw] = first
            arr_full[sw] = full
        self.head_ready[u] = x + t.entry_cycles
