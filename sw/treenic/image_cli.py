"""``treenic image``: compile a configuration image set to a file, or dump one.

    treenic image TOPOLOGY [--algorithm ALGO] --elements N [-o FILE] [--json]
    treenic image TOPOLOGY --algorithm multitree-sparse|topka --density D [--residual R]
                  [--flow-assignment F] [--codec] [--seed S] [-o FILE] [--json]
    treenic image --dump FILE [--rows NODE] [--json]

The set is :func:`treenic.firmware.image.compile_images`'s output, the bytes the driver's
``LOAD_CONFIG`` sends (:meth:`~treenic.firmware.image.ImageSet.to_bytes`): version-2 images
for a dense algorithm, version-3 images (the dense MultiTree tables plus each node's sparse
program) for a sparse one. ``--dump`` reads a set back through the same checks the loader
applies and prints what it holds; ``--rows NODE`` adds that node's sparse rows, decoded.
"""
from __future__ import annotations

import json
from pathlib import Path

from treenic.firmware.image import DENSE_VERSION, VERSION, ImageSet, compile_images
from treenic.schedule.sparse_table import unpack_row

#: sparse options of ``compile_images`` the command passes on when given
SPARSE_FLAGS = ("residual", "flow_assignment")


def add_arguments(p) -> None:
    p.add_argument("topology", nargs="?", help="compile for this topology (e.g. ring:4)")
    p.add_argument("--algorithm", "-a", default="multitree",
                   help="a dense algorithm, or multitree-sparse / topka (with --density)")
    p.add_argument("--elements", "-n", type=int, default=1024, help="float32 per node")
    p.add_argument("--density", type=float, default=None, help="sparse: top-k density")
    p.add_argument("--residual", choices=("local", "global"), default=None,
                   help="multitree-sparse's residual (default local)")
    p.add_argument("--flow-assignment", choices=("contiguous", "hash"), default=None,
                   help="multitree-sparse's flows (default contiguous)")
    p.add_argument("--codec", action="store_true",
                   help="sparse: codec messages (pairs or bitmap + values)")
    p.add_argument("--seed", type=int, default=0, help="sparse: the hash flows' seed")
    p.add_argument("--output", "-o", metavar="FILE", help="write the image set here")
    p.add_argument("--dump", metavar="FILE", help="read an image set and print what it holds")
    p.add_argument("--rows", type=int, metavar="NODE",
                   help="with --dump: also print NODE's sparse rows")
    p.add_argument("--json", action="store_true")


def run(args, *, error) -> int:
    """``error(message)`` raises the CLI's one-line error."""
    if args.dump:
        if args.topology or args.output:
            error("--dump FILE reads a set; it takes no TOPOLOGY or --output")
        images, size = _read(args.dump, error)
    else:
        if not args.topology:
            error("give a TOPOLOGY to compile, or --dump FILE")
        if args.rows is not None:
            error("--rows goes with --dump")
        images = _compile(args, error)
        blob = images.to_bytes()
        size = len(blob)
        if args.output:
            _write(args.output, blob, error)
    info = summary(images, size)
    if args.rows is not None:
        if not 0 <= args.rows < images.nodes:
            error(f"--rows {args.rows}: the set has nodes 0..{images.nodes - 1}")
        if images[0].sparse is None:
            error("--rows: the set has no sparse program (a dense-only set)")
        info["rows"] = [_row(w) for w in images[args.rows].sparse.rows]
    if args.json:
        print(json.dumps(info))
    else:
        _print(info, args)
    return 0


def _compile(args, error) -> ImageSet:
    from treenic.cli import check_elements, topology_arg
    topo = topology_arg(args.topology)
    check_elements(args.elements, topo.n)
    sparse = {k: getattr(args, k) for k in SPARSE_FLAGS if getattr(args, k) is not None}
    if args.density is not None or args.codec or args.seed:
        sparse.update(codec=args.codec, seed=args.seed)
    if args.density is not None and not 0 < args.density <= 1:
        error(f"--density must be in (0, 1], got {args.density}")
    return compile_images(topo.spec, args.algorithm, args.elements, density=args.density,
                          **sparse)


def _read(path: str, error) -> tuple[ImageSet, int]:
    from treenic.driver.protocol import MAX_IMAGE_SET_BYTES
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > MAX_IMAGE_SET_BYTES:          # bounded before a byte is read
            error(f"--dump {path}: {size} bytes, more than an image set may be "
                  f"({MAX_IMAGE_SET_BYTES})")
        data = p.read_bytes()
    except OSError as e:
        error(f"--dump {path}: {e.strerror}")
    return ImageSet.from_bytes(data), len(data)


def _write(path: str, blob: bytes, error) -> None:
    from treenic.cli import check_output_path
    out = check_output_path(path, "--output")
    try:
        out.write_bytes(blob)
    except OSError as e:
        error(f"--output {path}: {e.strerror}")


def summary(images: ImageSet, size: int) -> dict:
    """What an image set holds: topology, sizes, versions, and its sparse program."""
    first = images[0]
    info = {"topology": images.topology, "nodes": images.nodes, "elements": images.elements,
            "bytes": size, "version": VERSION if first.sparse else DENSE_VERSION,
            "dense": {"steps": first.table.layout.steps, "flows": first.table.layout.flows,
                      "table_rows": [len(im.table.entries) for im in images]},
            "sparse": None}
    s = first.sparse
    if s is not None:
        info["sparse"] = {
            "algorithm": s.algorithm, "residual": s.residual,
            "flow_assignment": s.flow_assignment, "hash_seed": s.hash_seed,
            "messages": "codec (pairs or bitmap + values)" if s.codec else "pair flits",
            "density": s.density, "table_version": s.table_version, "chunks": s.chunks,
            "budgets": sorted(set(s.kb)), "max_flow": s.max_flow, "max_k": s.max_k,
            "rx_flits": s.rx_flits, "buffer_words": s.buffer_words,
            "residual_base": s.residual_base, "result_base": s.result_base,
            "ideal_cycles": s.ideal_cycles, "link_flits": s.link_flits,
            "rows_per_node": [len(im.sparse.rows) for im in images]}
    return info


def _row(word: int) -> dict:
    r = unpack_row(word)
    return dict(r, op=r["op"].name)


def _print(info: dict, args) -> None:
    d = info["dense"]
    print(f"image set for {info['topology'] or '(no topology)'}: {info['nodes']} nodes, "
          f"{info['elements']} elements, version {info['version']}, {info['bytes']} bytes"
          + (f", written to {args.output}" if args.output else ""))
    print(f"  dense: {d['steps']} steps, {d['flows']} flows, table rows per node "
          f"{min(d['table_rows'])}..{max(d['table_rows'])}")
    s = info["sparse"]
    if s is not None:
        print(f"  sparse: {s['algorithm']} ({s['residual']} residual, {s['flow_assignment']} "
              f"flows, {s['messages']}), density {s['density']}, budgets {s['budgets']}, "
              f"rows per node {min(s['rows_per_node'])}..{max(s['rows_per_node'])}, "
              f"table version {s['table_version']}")
    for i, r in enumerate(info.get("rows", [])):
        print(f"  row {i:3d}: {r['op']:<8} step {r['step']:3d} chunk {r['chunk']:3d} port "
              f"{r['port']:2d} lo {r['lo']:6d} n {r['n']:6d} k {r['k']:6d}")
