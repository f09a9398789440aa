import pytest

from treenic.algorithms import build
from treenic.firmware.image import ConfigImage, ImageError, build_image, build_images


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
