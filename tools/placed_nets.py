"""The longest nets of a placed design: how far apart the cells on each net sit.

nextpnr's placement-only runs (``--no-route``) print an Fmax estimate but no path, and
``tools/netlist_depth.py`` counts logic levels, not distance. This reads the placed netlist
nextpnr writes (``--write routed.json``, also after ``--no-route``), takes every net's
half-perimeter (the width plus the height of the box around its cells, in tiles) and groups
the longest nets by their RTL name with the digits folded, so that 32 bits of one bus or
128 copies of one block-RAM pin are one line::

    python tools/placed_nets.py build/synth/nic_core_sparse/pnr/routed.json [--top 40]

The die of the LFE5UM5G-85F is 126 x 95 tiles: a net near 200 spans it.
"""
from __future__ import annotations

import argparse
import collections
import json
import re
import sys

_BEL = re.compile(r"X(\d+)/Y(\d+)/")
#: the nets every cell has, not logic: left out
_GLOBAL = re.compile(r"^\$glbnet\$|^\$PACKER_(GND|VCC)_NET")


def net_spans(design: dict) -> list[tuple[int, int, str]]:
    """(half-perimeter in tiles, cells on the net, RTL name) of every net of two or more
    placed cells, longest first."""
    top = next(m for m in design["modules"].values() if m.get("attributes", {}).get("top"))
    where = {}
    for name, cell in top["cells"].items():
        hit = _BEL.match(cell.get("attributes", {}).get("NEXTPNR_BEL", ""))
        if hit:
            where[name] = (int(hit.group(1)), int(hit.group(2)))
    cells_on = collections.defaultdict(set)
    for name, cell in top["cells"].items():
        if name in where:
            for bits in cell["connections"].values():
                for b in bits:
                    if isinstance(b, int):
                        cells_on[b].add(name)
    names: dict[int, str] = {}
    for name, info in top["netnames"].items():
        for b in info["bits"]:
            if isinstance(b, int) and (b not in names or len(name) < len(names[b])):
                names[b] = name
    spans = []
    for b, cells in cells_on.items():
        name = names.get(b, "?")
        if len(cells) < 2 or _GLOBAL.match(name):
            continue
        xs, ys = zip(*(where[c] for c in cells))
        spans.append((max(xs) - min(xs) + max(ys) - min(ys), len(cells), name))
    spans.sort(reverse=True)
    return spans


def families(spans, longest: int) -> list[tuple[int, int, str]]:
    """The ``longest`` nets grouped by name with digits folded: (nets, longest span, name),
    the family with the longest net first."""
    count, span = collections.Counter(), {}
    for hp, _, name in spans[:longest]:
        key = re.sub(r"\d+", "#", name)
        count[key] += 1
        span[key] = max(span.get(key, 0), hp)
    return sorted(((n, span[k], k) for k, n in count.items()), key=lambda f: (-f[1], -f[0]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("placed", help="nextpnr's placed or routed JSON (--write)")
    ap.add_argument("--longest", type=int, default=3000, help="nets to group (default 3000)")
    ap.add_argument("--top", type=int, default=30, help="families to list")
    args = ap.parse_args(argv)
    try:
        with open(args.placed) as f:
            design = json.load(f)
    except (OSError, ValueError) as e:
        print(f"placed_nets: cannot read {args.placed}: {e}", file=sys.stderr)
        return 2
    spans = net_spans(design)
    if not spans:
        print(f"placed_nets: {args.placed} has no placed cells (NEXTPNR_BEL)", file=sys.stderr)
        return 2
    print(f"{len(spans)} nets; the {min(args.longest, len(spans))} longest, by family "
          "(nets, longest half-perimeter in tiles, name):")
    for n, hp, name in families(spans, args.longest)[:args.top]:
        print(f"{n:6d} {hp:5d}  {name[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
