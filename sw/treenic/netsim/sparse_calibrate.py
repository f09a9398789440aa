"""Calibration of the sparse engine model (:mod:`.sparse`): one ``SparseEngine`` (W = 16,
16 scan bins) in the Amaranth simulator runs one-row programs and reports its ``cycles``
counter (``busy`` set to cleared). The records are :data:`.sparse.CALIBRATION`; re-measure
them with::

    python -m treenic.netsim.sparse_calibrate

No fabric run (``rtl_runs``) enters the model's constants: those are all held out.
"""
from __future__ import annotations

import json
import sys

import numpy as np

__all__ = ["run_rows", "measure", "region_rows", "CASES"]

#: (label, n, k) of the calibration programs; GSEND needs a ROOT before it (its final slot)
CASES = [("END", 0, 0), ("ROOT", 500, 50), ("ROOT", 250, 12), ("ROOT", 256, 1),
         ("SEND", 500, 50), ("SEND", 250, 12), ("SEND", 256, 1), ("RECV", 500, 50),
         ("RECV", 500, 12), ("GRECV", 500, 50), ("GRECV", 500, 12), ("ROOT+GSEND", 500, 50)]
N = 512


def _flits(fmt, step, chunk, pairs):
    """One sparse message (head, a body per pair, tail) as rx flit words."""
    from treenic.hdl.link.flit import FlitType, Op
    head = fmt.sub_head.const({"flow": chunk, "op": Op.SPARSE, "step": step, "offset": 0,
                               "length": len(pairs)}).as_value().value
    out = [fmt.flit.const({"type": FlitType.SUB_HEAD, "data": head}).as_value().value]
    out += [fmt.flit.const({"type": FlitType.SUB_BODY, "data": i | int(np.float32(v).view(
        np.uint32)) << 32}).as_value().value for i, v in pairs]
    out.append(fmt.flit.const({"type": FlitType.MSG_TAIL, "data": len(pairs)}).as_value().value)
    return out


def run_rows(rows, flits=(), *, lanes=16, scan_bins=16) -> int:
    """Engine cycles of one program (rows, END included) on random gradients, with
    ``flits`` already arriving on port 0."""
    from treenic.hdl.link.flit import FlitFormat
    from treenic.hdl.nic.sparse_engine import SparseEngine
    from treenic.hdl.nic.sparse_fabric import load_words, start_word
    from treenic.hdl.sparse.simdrive import run_with_link, send_words
    from treenic.schedule.sparse_table import SparseProgram
    fmt = FlitFormat()
    eng = SparseEngine(ports=1, depth=N, lanes=lanes, max_flow=N, chunks=2, slot=64, rows=8,
                       rx_depth=128, scan_bins=scan_bins, fmt=fmt)
    prog = SparseProgram("ring:2", N, [rows], 2, N, 64, 128, 1)
    grads = np.random.default_rng(0).standard_normal(N).astype(np.float32)
    got = {}

    async def host(ctx):
        await send_words(ctx, eng.host_i, load_words(prog, 0, grads) + [start_word()])
        await ctx.tick().until(eng.busy == 1)
        await ctx.tick().until(eng.busy == 0)
        got["cycles"] = ctx.get(eng.cycles)

    run_with_link(eng, host, flits)
    return int(got["cycles"])


def program(label: str, n: int, k: int):
    """(rows, rx flits) of one calibration case."""
    from treenic.hdl.link.flit import FlitFormat
    from treenic.schedule.sparse_table import SparseOp, pack_row
    end = pack_row(op=SparseOp.END)
    if label == "END":
        return [end], []
    if label in ("ROOT", "SEND"):
        return [pack_row(op=SparseOp[label], step=1, lo=0, n=n, k=k), end], []
    if label == "ROOT+GSEND":
        return [pack_row(op=SparseOp.ROOT, lo=0, n=n, k=k),
                pack_row(op=SparseOp.GSEND, step=2, lo=0, n=n, k=k), end], []
    pairs = [(i * (n // k), 1.0) for i in range(k)]
    return ([pack_row(op=SparseOp[label], step=1, lo=0, n=n, k=k), end],
            _flits(FlitFormat(), 1, 0, pairs))


def measure(cases=CASES) -> dict:
    return {c: run_rows(*program(*c)) for c in cases}


def region_rows() -> dict:
    """Engine cycles each slot / region row adds after a ROOT of 50 pairs (n = 250): ACC,
    ZERO, FIXUP over its slot, COPY of 256 words (what ``slot_fixed`` / ``copy_fixed`` are
    read from: the row's cycles beyond one, FIXUP two, a pair or word)."""
    from treenic.schedule.sparse_table import SparseOp, pack_row
    end = pack_row(op=SparseOp.END)
    root = pack_row(op=SparseOp.ROOT, step=1, lo=0, n=250, k=50)
    base = run_rows([root, end])
    rows = {"ACC": pack_row(op=SparseOp.ACC, lo=0), "ZERO": pack_row(op=SparseOp.ZERO, lo=0),
            "FIXUP": pack_row(op=SparseOp.FIXUP, lo=0, k=256),
            "COPY256": pack_row(op=SparseOp.COPY, lo=0, n=256, k=256)}
    return {name: run_rows([root, row, end]) - base for name, row in rows.items()}


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--regions", action="store_true",
                    help="the slot / region rows' cycles instead (region_rows)")
    args = ap.parse_args(argv)
    if args.regions:
        print(json.dumps(region_rows()))
        return 0
    rec = measure()
    print(json.dumps([[*c, v] for c, v in rec.items()]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
