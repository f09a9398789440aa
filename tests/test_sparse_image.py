"""The sparse program in the configuration image (version 3): round trip for
MultiTree-Sparse (both residuals, both flow assignments, codec on/off) and TopkA; version-2
images still read; every malformed section rejected with a one-line error naming it."""
import dataclasses
import struct
import zlib

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from treenic.firmware.image import (DENSE_VERSION, HEADER, HEADER_V3, MAX_SPARSE_ROWS,
                                    SPARSE_HEADER, VERSION, ConfigImage, ImageError, ImageSet,
                                    SparseSection, compile_images, decode_sparse_program,
                                    sparse_images)
from treenic.schedule.sparse_table import SparseOp, pack_row, sparse_model

TOPOLOGIES = ["ring:4", "ring:6", "torus:4x4"]
CONFIGS = [("multitree-sparse", dict(residual=r, flow_assignment=f, codec=c))
           for r in ("local", "global") for f in ("contiguous", "hash") for c in (False, True)]
CONFIGS += [("topka", dict(codec=c)) for c in (False, True)]


@pytest.mark.parametrize("topology", TOPOLOGIES)
@pytest.mark.parametrize("algorithm, kw", CONFIGS,
                         ids=[f"{a}-" + "-".join(str(v) for v in kw.values()) for a, kw in CONFIGS])
def test_round_trip(topology, algorithm, kw):
    _, prog = sparse_model(algorithm, topology, 1000, 0.05, seed=11, **kw)
    images = compile_images(topology, algorithm, 1000, density=0.05, seed=11, **kw)
    assert images == sparse_images(prog)          # compile_images goes through the compiler
    blob = images.to_bytes()
    back = ImageSet.from_bytes(blob)
    assert back == images and back.to_bytes() == blob
    got = decode_sparse_program(back)
    assert got == prog                            # every field, the hash order included
    assert (got.perm is None) == (kw.get("flow_assignment", "contiguous") == "contiguous")
    dense = compile_images(topology, "multitree", 1000)
    for im, d in zip(back, dense):
        raw = im.to_bytes()
        assert struct.unpack_from("<H", raw, 4)[0] == VERSION == 3
        assert dataclasses.replace(im, sparse=None) == d   # the dense part is unchanged
        assert im.sparse.rows == prog.rows[im.node]


def test_dense_images_are_still_version_2_byte_for_byte():
    """A dense-only image is written in the version-2 layout (36-byte header, no sparse
    field), and such an image -- old or new -- is read exactly as before."""
    for im in compile_images("torus:4x4", "multitree", 1000):
        raw = im.to_bytes()
        magic, version, hbytes, *_ = HEADER.unpack_from(raw)
        assert (magic, version, hbytes) == (b"TNCF", DENSE_VERSION, HEADER.size)
        back = ConfigImage.from_bytes(raw)
        assert back == im and back.sparse is None and back.to_bytes() == raw


def test_compile_images_sparse_arguments_checked():
    with pytest.raises(ImageError, match="multitree-sparse images need a density"):
        compile_images("ring:4", "multitree-sparse", 64)
    with pytest.raises(ImageError, match="are for multitree-sparse and topka images, not "
                                         "'multitree'"):
        compile_images("ring:4", "multitree", 64, density=0.1)
    with pytest.raises(ImageError, match="sparse program: topka has no flow assignment"):
        compile_images("ring:4", "topka", 64, density=0.1, flow_assignment="hash")
    with pytest.raises(ImageError, match="sparse program: .*empty flow"):
        compile_images("ring:4", "multitree-sparse", 2, density=0.5)


def test_dense_only_set_has_no_sparse_program():
    with pytest.raises(ImageError, match="no sparse section"):
        decode_sparse_program(compile_images("ring:4", "multitree", 64))


# ---- malformed images: CRC-valid, so the sparse checks are what rejects them --------------

def _image():
    return compile_images("ring:4", "multitree-sparse", 256, density=0.1).images[1]


def _reframe(raw: bytes, section: bytes, version: int = VERSION) -> bytes:
    """``raw`` (a version-3 image) with its sparse section replaced by ``section``: header
    length, version and CRC recomputed, so only the section's own checks can object."""
    (sparse_bytes,) = struct.unpack_from("<I", raw, HEADER.size)
    body = raw[:len(raw) - sparse_bytes] + section
    body = (body[:4] + struct.pack("<H", version) + body[6:HEADER.size] +
            struct.pack("<I", len(section)) + body[HEADER_V3.size:])
    body = body[:28] + b"\0\0\0\0" + body[32:]
    return body[:28] + struct.pack("<I", zlib.crc32(body)) + body[32:]


def _section(raw: bytes) -> bytes:
    (sparse_bytes,) = struct.unpack_from("<I", raw, HEADER.size)
    return raw[len(raw) - sparse_bytes:]


def _head(section: bytes, **fields) -> bytes:
    """The section with header fields replaced (names as in SPARSE_HEADER's layout)."""
    names = ["magic", "version", "algorithm", "flags", "chunks", "ports", "hash_seed",
             "density", "max_flow", "max_k", "rx_flits", "buffer_words", "residual_base",
             "result_base", "link_pairs", "link_flits", "ideal_cycles", "rows"]
    vals = dict(zip(names, SPARSE_HEADER.unpack_from(section)))
    vals.update(fields)
    return SPARSE_HEADER.pack(*vals.values()) + section[SPARSE_HEADER.size:]


def _with_row(section: bytes, index: int, word: int) -> bytes:
    (chunks,) = struct.unpack_from("<H", section, 8)
    at = SPARSE_HEADER.size + 4 * chunks + 12 * index
    return section[:at] + word.to_bytes(12, "little") + section[at + 12:]


def _rows(section: bytes) -> int:
    return SPARSE_HEADER.unpack_from(section)[-1]


MALFORMED = [
    ("image version", lambda s: (s, 9), r"config image version 9 unsupported \(reads 2 and 3\)"),
    ("empty section", lambda s: (b"", VERSION), "version 3 without a sparse section"),
    ("truncated header", lambda s: (s[:40], VERSION),
     r"node 1: sparse section: 40 bytes, shorter than its 68-byte header \(truncated\)"),
    ("truncated rows", lambda s: (s[:-5], VERSION),
     r"node 1: sparse section: \d+ bytes, its header says \d+ \(4 budgets, \d+ rows\) "
     r"\(truncated\)"),
    ("row count beyond bound", lambda s: (_head(s, rows=MAX_SPARSE_ROWS + 1), VERSION),
     f"node 1: sparse section: row count {MAX_SPARSE_ROWS + 1} exceeds the bound "
     f"{MAX_SPARSE_ROWS}"),
    ("row count beyond data", lambda s: (_head(s, rows=_rows(s) + 1), VERSION),
     "its header says .* rows\\) \\(truncated\\)"),
    ("magic", lambda s: (b"XXXX" + s[4:], VERSION), "sparse section: magic b'XXXX'"),
    ("table version", lambda s: (_head(s, version=3), VERSION),
     r"sparse table version 3 unsupported \(reads 1 and 2\)"),
    ("algorithm id", lambda s: (_head(s, algorithm=7), VERSION), "algorithm id 7 unknown"),
    ("flags", lambda s: (_head(s, flags=0x10), VERSION), "flags 0x10 has unknown bits"),
    ("chunks", lambda s: (_head(s, chunks=0), VERSION), "chunks=0 outside 1..256"),
    ("seed without hash", lambda s: (_head(s, hash_seed=5), VERSION),
     "hash_seed=5 with contiguous flows"),
    ("unknown op", lambda s: (_with_row(s, 0, pack_row(op=SparseOp.SEND) | 7 | 1 << 95),
                              VERSION), "sparse row 0: sparse row op code 15 is not a SparseOp"),
    ("v1 table with a v2 op", lambda s: (_with_row(_head(s, version=1), 0,
                                                   pack_row(op=SparseOp.COPY)), VERSION),
     "sparse row 0: op COPY needs sparse table version 2"),
    ("END early", lambda s: (_with_row(s, 0, pack_row(op=SparseOp.END)), VERSION),
     "sparse row 0: END must be the last row and only the last"),
    ("END missing", lambda s: (_with_row(s, _rows(s) - 1, pack_row(op=SparseOp.RECV)),
                               VERSION), r"sparse row \d+: the last row is RECV, not END"),
    ("chunk", lambda s: (_with_row(s, 0, pack_row(op=SparseOp.SEND, chunk=4)), VERSION),
     "sparse row 0: chunk=4 outside 0..3"),
    ("port", lambda s: (_with_row(s, 0, pack_row(op=SparseOp.SEND, port=9)), VERSION),
     "sparse row 0: port=9 outside 0..1"),
    ("buffer range", lambda s: (_with_row(s, 0, pack_row(op=SparseOp.SEND, lo=200, n=100)),
                                VERSION), "sparse row 0: lo\\+n=300 beyond buffer_words=256"),
    ("budget", lambda s: (_with_row(s, 0, pack_row(op=SparseOp.SEND, n=64, k=65)), VERSION),
     "sparse row 0: k=65 above max_k=6"),
    ("density", lambda s: (_head(s, density=1.5), VERSION), r"density=1.5 outside \(0, 1\]"),
    ("buffer_words", lambda s: (_head(s, buffer_words=10), VERSION),
     "buffer_words=10 outside 256..512"),
    ("residual_base", lambda s: (_head(s, residual_base=256), VERSION),
     "residual_base=256: residual_base \\+ 256 elements beyond buffer_words=256"),
]


@pytest.mark.parametrize("name, corrupt, msg", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_sparse_section_rejected(name, corrupt, msg):
    im = _image()
    raw = im.to_bytes()
    section, version = corrupt(_section(raw))
    bad = _reframe(raw, section, version)
    with pytest.raises(ImageError, match=msg) as e:
        ConfigImage.from_bytes(bad)
    assert "\n" not in str(e.value)
    assert ConfigImage.from_bytes(raw) == im      # nothing changed: the good image reads


def test_image_crc_covers_the_sparse_section():
    raw = _image().to_bytes()
    bad = raw[:-3] + bytes([raw[-3] ^ 1]) + raw[-2:]
    with pytest.raises(ImageError, match="CRC mismatch"):
        ConfigImage.from_bytes(bad)


def test_set_of_mixed_programs_rejected():
    ims = compile_images("ring:4", "multitree-sparse", 256, density=0.1).images
    other = compile_images("ring:4", "multitree-sparse", 256, density=0.2).images
    with pytest.raises(ImageError, match="node 2: sparse field density=0.2 differs from node "
                                         "0's 0.1"):
        ImageSet(ims[:2] + other[2:])
    dense = compile_images("ring:4", "multitree", 256).images
    with pytest.raises(ImageError, match="node 3: sparse section missing; node 0 has one"):
        ImageSet(ims[:3] + dense[3:])


def test_unencodable_section_refused_at_write():
    im = _image()
    bad = dataclasses.replace(im, sparse=dataclasses.replace(im.sparse, hash_seed=1 << 64))
    with pytest.raises(ImageError, match="node 1: sparse hash_seed=.* does not fit 64 bits"):
        bad.to_bytes()
    bad = dataclasses.replace(im, sparse=dataclasses.replace(im.sparse, algorithm="zen"))
    with pytest.raises(ImageError, match="sparse algorithm 'zen' has no image encoding"):
        bad.to_bytes()


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_random_byte_edits_are_an_image_error_or_a_valid_image(data):
    """Any single byte of the section changed (CRC recomputed): the loader either names the
    problem (ImageError) or reads an image that passes every check -- never another
    exception, never an unchecked row."""
    raw = _image().to_bytes()
    section = bytearray(_section(raw))
    at = data.draw(st.integers(0, len(section) - 1))
    section[at] = data.draw(st.integers(0, 255))
    try:
        im = ConfigImage.from_bytes(_reframe(raw, bytes(section)))
    except ImageError as e:
        assert str(e) and "\n" not in str(e)
    else:
        im.validate()
        assert isinstance(im.sparse, SparseSection)


# ---- the CLI: treenic image ----------------------------------------------------------------

def _cli(capsys, *argv):
    from treenic.cli import main
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_writes_and_dumps_a_sparse_set(tmp_path, capsys):
    import json
    path = tmp_path / "ring6.img"
    rc, out, _ = _cli(capsys, "image", "ring:6", "-a", "multitree-sparse", "-n", "600",
                      "--density", "0.05", "--residual", "global", "--flow-assignment", "hash",
                      "--seed", "4", "--codec", "-o", str(path), "--json")
    assert rc == 0
    written = json.loads(out)
    want = compile_images("ring:6", "multitree-sparse", 600, density=0.05, residual="global",
                          flow_assignment="hash", seed=4, codec=True)
    assert path.read_bytes() == want.to_bytes()
    rc, out, _ = _cli(capsys, "image", "--dump", str(path), "--rows", "2", "--json")
    dumped = json.loads(out)
    assert rc == 0 and dumped.pop("rows")[0]["op"] == "COPY" and dumped == written
    s = dumped["sparse"]
    assert (dumped["version"], s["algorithm"], s["residual"], s["flow_assignment"],
            s["hash_seed"]) == (3, "multitree-sparse", "global", "hash", 4)
    assert s["rows_per_node"] == [len(r) for r in decode_sparse_program(want).rows]


def test_cli_dense_set_and_errors(tmp_path, capsys):
    path = tmp_path / "d.img"
    assert _cli(capsys, "image", "mesh:2x2", "-n", "64", "-o", str(path))[0] == 0
    assert ImageSet.from_bytes(path.read_bytes()) == compile_images("mesh:2x2", "multitree", 64)
    (tmp_path / "cut.img").write_bytes(path.read_bytes()[:-3])
    for argv, msg in [(("image", "--dump", str(tmp_path / "cut.img")), "image set CRC mismatch"),
                      (("image", "--dump", str(path), "--rows", "0"), "no sparse program"),
                      (("image", "ring:4", "--density", "0.1"), "not 'multitree'"),
                      (("image", "ring:4", "-a", "topka", "--density", "2"), "--density must"),
                      (("image",), "give a TOPOLOGY")]:
        rc, out, err = _cli(capsys, *argv)
        assert rc == 2 and msg in err and err.count("\n") == 1 and not out


def test_fabric_sim_loads_the_engines_from_the_image_bytes(monkeypatch):
    """SparseFabricSim (the Verilated fabric of stand-alone engines: the bench) sizes the
    fabric with, and sends as PROG rows, the program decoded from the serialized image set --
    not the compiler's object. The Verilator build is replaced by a stand-in here (the
    CLI and the driver run the fabric of combined NICs, built from the same decoded
    program: tests/test_sparse_nic_cli.py, TREENIC_RTL_TESTS=1)."""
    import driver_helpers
    import treenic.hdl.nic.sparse_sim as ss
    from treenic.hdl.nic.sparse_engine import HostKind
    from treenic.hdl.nic.sparse_fabric import load_words

    seen = {}
    driver_helpers.stub_verilator(monkeypatch, seen)

    real = ss.program_from_image_bytes

    def decode(data):
        seen.setdefault("bytes", []).append(data)
        seen["program"] = real(data)
        return seen["program"]

    monkeypatch.setattr(ss, "program_from_image_bytes", decode)
    sim = ss.SparseFabricSim("ring:6", 600, 0.05, flow_assignment="hash", residual="global",
                             seed=3)
    assert seen["bytes"] == [sim.images.to_bytes()]
    assert sim.program is seen["program"] and seen["fabric"].program is sim.program
    assert sim.program == decode_sparse_program(ImageSet.from_bytes(seen["bytes"][0]))
    g = np.zeros(600, np.float32)
    for u, im in enumerate(ImageSet.from_bytes(seen["bytes"][0])):
        words = load_words(sim.program, u, g)
        prog = [w >> 27 for w in words if w & 7 == HostKind.PROG]
        assert prog == im.sparse.rows          # the PROG rows are the image's rows


def test_protocol_loader_accepts_a_sparse_set():
    """LOAD_CONFIG's checks (driver.config.parse_image_set) take a version-3 set: its dense
    part is the MultiTree schedule the sparse program runs on."""
    from treenic.driver.config import parse_image_set
    images = compile_images("ring:4", "multitree-sparse", 4096, density=0.01)
    got, schedule = parse_image_set(images.to_bytes(), 4)
    assert got == images and schedule.n == 4
    assert decode_sparse_program(got).rows == decode_sparse_program(images).rows
