"""Configuration images: round trip, corruption, the image set, the compiler's ORDER table,
and semantic validation (CRC-valid nonsense rejected by the loader, naming the field)."""
import dataclasses
import re
import struct
import zlib

import pytest
from hypothesis import given, settings, strategies as st

from treenic.algorithms import build
from treenic.firmware.image import (FLIT_BITS_RANGE, NO_PEER, ConfigImage, ImageError, ImageSet,
                                    build_image, build_images, compile_images)
from treenic.schedule.ir import Op


def test_round_trip_all_nodes():
    s = build("multitree", "torus:4x4")
    blobs = build_images(s, 16384)
    assert len(blobs) == 16
    for v, b in enumerate(blobs):
        im = ConfigImage.from_bytes(b)
        assert im.node == v and im.nodes == 16 and im.ports == 4
        assert im.link_map == [p.peer for p in s.topology.ports(v)]
        assert im.table.entries == build_image(s, v, 16384).table.entries
        # 1024 floats per chunk = 512 flits of 64 bits, + head + tail + 4 cycles of link latency
        assert im.lockstep_cycles == 512 + 2 + 4


def test_switch_ports_marked():
    im = build_image(build("multitree", "fattree:16"), 3, 64)
    assert im.link_map == [0xFFFF]


@pytest.mark.parametrize("corrupt, msg", [
    (lambda b: b"XXXX" + b[4:], "magic"),
    (lambda b: b[:4] + b"\x07\x00" + b[6:], "version"),
    (lambda b: b[:-1], "bytes, header says"),
    (lambda b: b[:40] + bytes([b[40] ^ 1]) + b[41:], "CRC mismatch"),
    (lambda b: b[:10], "too short"),
])
def test_corruption_detected(corrupt, msg):
    b = build_images(build("multitree", "mesh:2x2"), 100)[0]
    with pytest.raises(ImageError, match=msg):
        ConfigImage.from_bytes(corrupt(b))


# ---- the image set and the ORDER table ---------------------------------------------------

def _legacy_order_join(images):
    """Reference for the ORDER table: join the images' REDUCE entries through their link
    maps (sender's parent port -> receiver, receiver's first port back to the sender)."""
    out = [dict() for _ in images]
    for v, img in enumerate(images):
        for e in img.table.entries:
            if e.op == Op.REDUCE and e.parent_port is not None:
                u = img.link_map[e.parent_port]
                if u != NO_PEER:
                    out[u][(e.flow, images[u].link_map.index(v))] = e.step
    return out


@pytest.mark.parametrize("spec, alg", [("torus:4x4", "multitree"), ("ring:8", "ring"),
                                       ("mesh:2x2", "multitree"), ("torus:3x3", "ring2d"),
                                       ("mesh:2x3", "multitree")])
def test_order_table_matches_the_link_map_join(spec, alg):
    """On schedules whose transfers are one hop (what the NIC receives), the compiler's
    ORDER table equals the join over the images' tables and link maps."""
    images = compile_images(spec, alg, 100)
    got = [{(f, q): s for f, q, s in im.order} for im in images]
    assert got == _legacy_order_join(images.images)
    assert sum(len(im.order) for im in images) > 0


def test_image_set_round_trip_and_corruption():
    images = compile_images("torus:4x4", "multitree", 1000)
    blob = images.to_bytes()
    back = ImageSet.from_bytes(blob)
    assert back == images and back.nodes == 16 and back.elements == 1000
    assert back.topology == "torus:4x4"
    assert [im.to_bytes() for im in back] == build_images(build("multitree", "torus:4x4"), 1000)
    for bad, msg in [(b"XXXX" + blob[4:], "magic"), (blob[:-1], "CRC"),
                     (blob[:12] + bytes([blob[12] ^ 1]) + blob[13:], "CRC")]:
        with pytest.raises(ImageError, match=msg):
            ImageSet.from_bytes(bad)


def test_image_set_rejects_inconsistent_sets():
    ims = compile_images("ring:8", "ring", 64).images
    with pytest.raises(ImageError, match="image 0 must be node 0"):
        ImageSet(ims[1:] + ims[:1])
    with pytest.raises(ImageError, match="field nodes=8, the set has 7"):
        ImageSet(ims[:7])
    other = compile_images("ring:8", "ring", 32).images
    with pytest.raises(ImageError, match="field elements=32"):
        ImageSet(ims[:4] + other[4:])
    # node 0 names node 2 as a peer: CRC-valid, each image fine alone, the set is not
    twisted = dataclasses.replace(ims[0], link_map=[2, ims[0].link_map[1]])
    with pytest.raises(ImageError, match=r"node 0: field link_map\[0\]=2: node 2 has no port"):
        ImageSet([twisted] + ims[1:])


def test_image_set_is_held_to_its_topology():
    """A fabric wired as one topology refuses images compiled for another, naming the
    port, before anything is built (FabricSim checks first)."""
    from treenic.hdl.nic.fabric_sim import FabricSim
    from treenic.topology import parse
    images = compile_images("mesh:2x2", "multitree", 16)
    images.check_topology(parse("mesh:2x2"))
    with pytest.raises(ImageError, match=r"node 0: field link_map\[0\]=2, topology ring:4 has"):
        images.check_topology(parse("ring:4"))
    with pytest.raises(ImageError, match="image set has 4 nodes, topology ring:8 8"):
        FabricSim("ring:8", None, None, images=images)
    with pytest.raises(ValueError, match="needs an algorithm"):
        FabricSim("ring:4", None, 16)


# ---- semantic validation (property tests over random field edits) ------------------------

# 9 nodes: every field has representable out-of-range values (9 flows in 4 bits, ...)
BASE = compile_images("torus:3x3", "multitree", 100)[5]
BASE_BYTES = BASE.to_bytes()
LAYOUT = BASE.table.layout
ROWS = [i for i, e in enumerate(BASE.table.entries) if e.op != Op.NOP]
FIELD_BITS = dict(LAYOUT.fields)


def _decode(image: ConfigImage):
    """Serialize (with a valid CRC) and load: the loader's view of an edited image."""
    return ConfigImage.from_bytes(image.to_bytes())


def _header_edit(offset: int, fmt: str, value: int) -> bytes:
    b = bytearray(BASE_BYTES)
    struct.pack_into(fmt, b, offset, value)
    struct.pack_into("<I", b, 28, 0)
    struct.pack_into("<I", b, 28, zlib.crc32(bytes(b)))
    return bytes(b)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["flit_bits", "node", "lockstep_cycles"]), st.data())
def test_header_nonsense_is_rejected_by_name(field, data):
    offset, fmt, bad = {
        "flit_bits": (14, "<H", st.integers(0, 0xFFFF).filter(lambda v: v not in FLIT_BITS_RANGE)),
        "node": (8, "<H", st.integers(BASE.nodes, 0xFFFF)),
        "lockstep_cycles": (20, "<I", st.just(0)),
    }[field]
    with pytest.raises(ImageError, match=rf"field {field}="):
        ConfigImage.from_bytes(_header_edit(offset, fmt, data.draw(bad)))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 16).map(lambda v: 32 * v), st.integers(1, 2**32 - 1))
def test_header_edits_in_range_are_accepted(flit_bits, lockstep):
    b = _header_edit(14, "<H", flit_bits)
    img = ConfigImage.from_bytes(b)
    img.lockstep_cycles = lockstep
    assert _decode(img).flit_bits == flit_bits


@settings(max_examples=60, deadline=None)
@given(st.integers(0, BASE.ports - 1),
       st.one_of(st.just(BASE.node), st.integers(BASE.nodes, NO_PEER - 1)))
def test_link_map_peer_out_of_range_or_self_is_rejected(port, peer):
    links = list(BASE.link_map)
    links[port] = peer
    with pytest.raises(ImageError, match=rf"field link_map\[{port}\]={peer}"):
        _decode(dataclasses.replace(BASE, link_map=links))


def _bad_row_value(field, e, draw):
    top = (1 << FIELD_BITS[field]) - 1
    if field == "flow":
        return draw(st.integers(LAYOUT.flows, top))
    if field == "step":
        return draw(st.one_of(st.just(0), st.integers(LAYOUT.steps + 1, top)))
    if field == "parent_port":
        return draw(st.integers(BASE.ports, LAYOUT.port_nil - 1))
    if field == "parent":
        return draw(st.one_of(st.just(BASE.node), st.integers(BASE.nodes, LAYOUT.node_nil - 1)))
    return draw(st.integers(BASE.elements - e.start + 1, top))        # size: past elements


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(ROWS), st.sampled_from(["flow", "step", "parent_port", "parent", "size"]),
       st.data())
def test_row_out_of_bounds_is_rejected_by_name(row, field, data):
    e = BASE.table.entries[row]
    value = _bad_row_value(field, e, data.draw)
    entries = list(BASE.table.entries)
    entries[row] = dataclasses.replace(e, **{field: value})
    image = dataclasses.replace(BASE, table=dataclasses.replace(BASE.table, entries=entries))
    name = "start+size" if field == "size" else field
    with pytest.raises(ImageError, match=rf"field table row {row} {re.escape(name)}="):
        _decode(image)


@pytest.mark.parametrize("row", ROWS[:3])
def test_row_with_an_unknown_op_code_is_rejected(row):
    entries = list(BASE.table.entries)
    entries[row] = dataclasses.replace(entries[row], op=3)      # 2 bits hold it; Op does not
    image = dataclasses.replace(BASE, table=dataclasses.replace(BASE.table, entries=entries))
    with pytest.raises(ImageError, match="node 5: table: table row has unknown op code 3"):
        _decode(image)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(ROWS), st.data())
def test_row_edits_in_bounds_are_accepted(row, data):
    e = BASE.table.entries[row]
    new = dataclasses.replace(e, flow=data.draw(st.integers(0, LAYOUT.flows - 1)),
                              step=data.draw(st.integers(1, LAYOUT.steps)),
                              size=data.draw(st.integers(0, BASE.elements - e.start)))
    entries = list(BASE.table.entries)
    entries[row] = new
    image = dataclasses.replace(BASE, table=dataclasses.replace(BASE.table, entries=entries))
    assert _decode(image).table.entries[row] == new


@settings(max_examples=60, deadline=None)
@given(st.integers(0, len(BASE.order) - 1), st.sampled_from([0, 1, 2]), st.data())
def test_order_entry_out_of_bounds_is_rejected_by_name(i, k, data):
    bad = [st.integers(LAYOUT.flows, 0xFFFF), st.integers(BASE.ports, 0xFFFF),
           st.one_of(st.just(0), st.integers(LAYOUT.steps + 1, 0xFFFF))][k]
    order = list(BASE.order)
    entry = list(order[i])
    entry[k] = data.draw(bad)
    order[i] = tuple(entry)
    name = ["flow", "rx_port", "step"][k]
    with pytest.raises(ImageError, match=rf"field order\[{i}\]\.{name}="):
        _decode(dataclasses.replace(BASE, order=order))


def test_host_loader_rejects_a_bad_image_before_any_write():
    """One nonsense image in the set: host_writes raises naming it and returns no writes
    for any node (nothing reaches a NIC)."""
    from treenic.hdl.nic.host import host_writes, params_for_images
    images = compile_images("torus:4x4", "multitree", 100)
    params = params_for_images(images)
    blobs = [im.to_bytes() for im in images]
    blobs[9] = dataclasses.replace(images[9], flit_bits=65).to_bytes()
    sent = []
    with pytest.raises(ImageError, match="node 9: field flit_bits=65"):
        sent.extend(host_writes(params, blobs))
    assert sent == []
    assert len(host_writes(params, images)) == 16


# ---- decode_schedule: the schedule a set's rows describe (what the golden engine runs) ----

@pytest.mark.parametrize("spec, alg", [("ring:4", "ring"), ("torus:4x4", "multitree"),
                                       ("torus:4x4", "dbtree"), ("ring:8", "halving-doubling"),
                                       ("torus:4x4", "ring2d"), ("fattree:4", "multitree")])
@pytest.mark.parametrize("elements", [0, 7, 257])
def test_decoded_schedule_executes_bit_identically(spec, alg, elements):
    """Encode, serialize, decode, read the schedule back: the golden executor on it gives
    the compiled schedule's bits (non-neighbour senders and switch networks included)."""
    import numpy as np
    from treenic.firmware.image import decode_schedule
    from treenic.schedule.execute import execute
    s = build(alg, spec)
    decoded = decode_schedule(ImageSet.from_bytes(compile_images(None, s, elements).to_bytes()))
    assert (decoded.n, decoded.steps, decoded.num_chunks) == (s.n, s.steps, s.num_chunks)
    g = np.random.default_rng(elements).standard_normal((s.n, elements)).astype(np.float32)
    assert np.array_equal(execute(decoded, g).view(np.uint32), execute(s, g).view(np.uint32))


def test_decoded_schedule_refuses_sets_that_are_not_one_schedule():
    """Each node valid on its own, but the rows do not describe one schedule: named."""
    from treenic.firmware.image import decode_schedule
    from treenic.schedule.table import Entry
    s = build("multitree", "ring:4")
    ims = compile_images(None, s, 64)
    with pytest.raises(ImageError, match="names no topology"):
        decode_schedule(ImageSet(ims.images, ""))
    rows = ims[2].table.entries
    i = next(k for k, e in enumerate(rows) if e.op == Op.REDUCE and e.parent is not None)
    e = rows[i]
    rows[i] = Entry(e.op, e.flow, e.step, e.parent, e.children, e.parent_port,
                    e.child_ports, e.start, e.size + 1)             # range not the flow's
    with pytest.raises(ImageError, match=r"node \d+: field table"):
        decode_schedule(ImageSet(ims.images, "ring:4"))
    ims = compile_images(None, s, 64)
    ims[3].order = ims[3].order[1:]                                  # one ORDER entry lost
    with pytest.raises(ImageError, match="node 3: field order"):
        decode_schedule(ImageSet(ims.images, "ring:4"))


def test_nic_model_consumes_the_decoded_images():
    """hdl.nic.model.expected_buffers reads the image bytes the RTL loads."""
    import numpy as np
    from treenic.hdl.nic.model import expected_buffers
    from treenic.schedule.execute import execute
    s = build("multitree", "torus:4x4")
    data = compile_images(None, s, 100).to_bytes()
    g = np.random.default_rng(5).standard_normal((16, 100)).astype(np.float32)
    assert np.array_equal(expected_buffers(data, g).view(np.uint32),
                          execute(s, g).view(np.uint32))
    with pytest.raises(ImageError, match="CRC"):
        expected_buffers(data[:-1] + bytes([data[-1] ^ 1]), g)
