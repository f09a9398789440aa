import numpy as np
import pytest

from treenic.algorithms import build
from treenic.schedule.ir import Op, ScheduleError
from treenic.schedule.table import (TableImage, TableLayout, decode_entry, encode_entry,
                                    format_table, node_entries, table_image)


@pytest.mark.parametrize("spec", ["mesh:2x2", "torus:4x4", "torus:8x8", "fattree:16", "ring:8"])
def test_round_trip(spec):
    s = build("multitree", spec)
    for v in (0, s.n - 1):
        im = table_image(s, v, 123457)
        back = TableImage.from_bytes(im.to_bytes())
        assert back.entries == im.entries and back.node == v and back.elements == 123457


def test_widths_follow_node_count():
    small = TableLayout.for_schedule(build("multitree", "mesh:2x2"), 1024)
    big = TableLayout.for_schedule(build("multitree", "torus:8x8"), 1 << 24)
    assert dict(small.fields)["children"] == 4 and dict(big.fields)["children"] == 64
    assert dict(big.fields)["parent"] == 7 and big.node_nil == 127
    # the paper quotes ~200 bits per entry for 64 nodes
    assert 120 <= big.row_bits <= 200


def test_entries_cover_every_step_and_ranges():
    s = build("multitree", "torus:4x4")
    bounds = s.chunk_bounds(1000)
    for v in range(s.n):
        ents = node_entries(s, v, 1000)
        assert {e.step for e in ents} == set(range(1, s.steps + 1))
        for e in ents:
            if e.op != Op.NOP:
                assert (e.start, e.size) == (bounds[e.flow], bounds[e.flow + 1] - bounds[e.flow])
        assert [e.sort_key() for e in ents] == sorted(e.sort_key() for e in ents)


def test_ports_match_topology():
    s = build("multitree", "torus:4x4")
    topo = s.topology
    for e in node_entries(s, 5):
        if e.parent is not None and e.op == Op.REDUCE:
            assert topo.ports(5)[e.parent_port].peer == e.parent
        for c in e.children:
            assert topo.port_to(5, c) in e.child_ports


def test_corrupt_images_rejected():
    im = table_image(build("multitree", "mesh:2x2"), 0, 64).to_bytes()
    with pytest.raises(ScheduleError, match="magic"):
        TableImage.from_bytes(b"XXXX" + im[4:])
    with pytest.raises(ScheduleError, match="version"):
        TableImage.from_bytes(im[:4] + b"\x09\x00" + im[6:])
    with pytest.raises(ScheduleError, match="row bytes"):
        TableImage.from_bytes(im[:-1])
    layout = TableLayout(4, 2, 4, 4, 7)
    with pytest.raises(ScheduleError, match="unknown op"):
        decode_entry(3, layout)
    with pytest.raises(ScheduleError, match="does not fit"):
        encode_entry(node_entries(build("multitree", "mesh:2x2"), 0, 1024)[0], layout)


def test_printout_like_fig5():
    text = format_table(build("multitree", "mesh:2x2"), 0)
    assert text.splitlines()[1].split()[:5] == ["Op", "FlowID", "Parent", "Children", "Step"]
    assert "Reduce  3       1       nil       1" in text
