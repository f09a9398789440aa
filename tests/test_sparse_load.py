"""What the driver loads is what the NIC runs (issue 17): a sparse all-reduce on the fabric
server runs the sparse program of the image set the ranks loaded with LOAD_CONFIG.

The client compiles the request's sparse image set (``compile_images(..., density=...)``)
and loads it; LOAD_CONFIG refuses a sparse section that is not the compiler's program for
its parameters; both engines (golden and rtl) refuse -- one line, nothing run, nothing
recompiled -- a sparse START without a loaded sparse program or whose parameters differ from
it; status() names the image (config id) the sparse steps ran from. Fast: no Verilator (the
Verilated run is tests/test_sparse_nic_cli.py::test_server_runs_the_loaded_sparse_program).
"""
import dataclasses
import socket
import zlib

import numpy as np
import pytest

import driver_helpers
from driver_helpers import expect_error, load, req
from treenic import algorithms
from treenic.driver import fabric as F
from treenic.driver import open_nic
from treenic.driver import protocol as P
from treenic.driver.config import ConfigRejected, parse_image_set, parse_sparse_program
from treenic.driver.errors import DriverError, FabricError
from treenic.firmware.image import ImageSet, compile_images, decode_sparse_program
from treenic.sparse.base import make

WORLD = 4
N = 1000
MT = "multitree-sparse"


@pytest.fixture
def server():
    yield from driver_helpers.golden_server(WORLD)


def bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


def sparse_set(density=0.1, elements=N, scheme=MT, **options):
    return compile_images("ring:4", scheme, elements, density=density, **options)


def hello(server, rank=0):
    c = socket.create_connection(server.address, timeout=5)
    payload = P.HELLO.pack(P.PROTOCOL_VERSION, rank, WORLD, 0, bytes.fromhex(server.secret))
    assert req(c, P.Msg.HELLO, payload)[0] == P.Msg.HELLO_ACK
    return c


def write(c, seq, elements=N):
    data = np.zeros(elements, "<f4").tobytes()
    wr = P.BUFFER.pack(seq, P.DTYPE_FLOAT32, P.BUF_GRADIENT, 0, elements) + data
    assert req(c, P.Msg.WRITE_BUFFER, wr)[0] == P.Msg.WRITE_ACK


def start(c, seq, density, scheme=MT, options=None, seed=0):
    name = scheme.encode()
    bits_ = P.pack_sparse_options(options or {})
    return req(c, P.Msg.START, P.START.pack(seq, P.MODE_SPARSE, bits_, len(name), density,
                                            seed) + name)


# ---- the client loads the request's sparse set; the server runs it --------------------------

@pytest.mark.parametrize("scheme,options,seed", [
    (MT, {"residual": "global", "flow_assignment": "hash"}, 3),
    (MT, {"residual": "local", "flow_assignment": "contiguous"}, 5),
    ("topka", {}, 0)])
def test_sparse_steps_run_the_loaded_set_and_status_names_it(server, scheme, options, seed):
    g = np.random.default_rng(7).standard_normal((WORLD, N)).astype(np.float32)
    sched = algorithms.build("multitree", "ring:4")

    def rank(r):
        with open_nic("rtl", r, WORLD, algorithm=sched, **server.endpoint, timeout=10) as c:
            t = g[r].copy()
            out = c.sparse_allreduce(t, 0.05, scheme=scheme, residual=np.zeros(N, np.float32),
                                     seed=seed, options=options)
            return t, out.residual, c.status()
    out, errs = driver_helpers.run_threads(rank, WORLD)
    assert errs == [None] * WORLD, errs
    ref = make(scheme, workers=WORLD, elements=N, density=0.05, seed=seed,
               **(dict(options, topology="ring:4") if options else {})).step(g)
    want_set = F.sparse_image_set("ring:4", scheme, N, 0.05, seed,
                                  F.check_sparse_request(scheme, options, sched))
    cid = zlib.crc32(want_set.to_bytes())
    for r in range(WORLD):
        assert np.array_equal(bits(out[r][0]), bits(ref.result[r]))
        assert np.array_equal(bits(out[r][1]), bits(ref.residuals[r]))
        st = out[r][2]
        assert st["sparse_image"] == f"{cid:#010x}" == st["sparse_images"][0]["config_id"]
        entry = st["sparse_images"][0]
        assert (entry["scheme"], entry["density"], entry["collectives"]) == (scheme, 0.05, 1)
        assert st["nic"]["config_id"] == cid == st["config_id"]
    # the server's engine holds that set's program, decoded from the bytes received
    engine = server.configs[cid][2]
    assert engine.sparse_program == decode_sparse_program(want_set)
    assert engine.config_id == cid


def test_contiguous_sets_do_not_depend_on_the_seed():
    """Only hash flows compile the seed in: requests differing in the seed alone share one
    set (and the server accepts either seed against it)."""
    a = F.sparse_image_set("ring:4", MT, N, 0.1, 1, {"flow_assignment": "contiguous"})
    b = F.sparse_image_set("ring:4", MT, N, 0.1, 2, {"flow_assignment": "contiguous"})
    h1 = F.sparse_image_set("ring:4", MT, N, 0.1, 1, {"flow_assignment": "hash"})
    h2 = F.sparse_image_set("ring:4", MT, N, 0.1, 2, {"flow_assignment": "hash"})
    assert a.to_bytes() == b.to_bytes() and h1.to_bytes() != h2.to_bytes()


@pytest.mark.parametrize("algorithm", ["multitree", "ring"])
def test_dense_steps_keep_a_sparse_set_holding_their_tables(server, algorithm):
    """After a sparse all-reduce, a dense one of the MultiTree schedule keeps the sparse set
    loaded (its dense part is exactly the schedule's dense set: on the rtl engine the dense
    and sparse steps then run on one fabric of combined NICs, no LOAD_CONFIG between); a
    schedule whose tables differ (Ring) loads its dense set back, and the sparse one its
    sparse set again -- each set compiled once. status() counts the dense collectives by
    the set they ran from."""
    sched = algorithms.build(algorithm, "ring:4")
    g = np.random.default_rng(3).standard_normal((WORLD, 64)).astype(np.float32)

    def rank(r):
        with open_nic("rtl", r, WORLD, algorithm=sched, **server.endpoint, timeout=10) as c:
            ids = []
            for step in range(2):
                c.sparse_allreduce(np.ones(64, np.float32), 0.25, scheme="topka")
                ids.append(c.config_id)
                t = g[r].copy()
                c.allreduce(t)
                ids.append(c.config_id)
            st = c.status()
            return t, ids, len(c._impl._image_sets), st
    out, errs = driver_helpers.run_threads(rank, WORLD)
    assert errs == [None] * WORLD, errs
    from treenic.schedule.execute import execute
    want = execute(sched, g)
    dense_id = zlib.crc32(compile_images(None, sched, 64).to_bytes())
    sparse_id = zlib.crc32(F.sparse_image_set("ring:4", "topka", 64, 0.25, 0).to_bytes())
    kept = algorithm == "multitree"
    for r in range(WORLD):
        t, ids, compiled, st = out[r]
        assert np.array_equal(bits(t), bits(want[r]))
        assert ids == ([sparse_id] * 4 if kept else [sparse_id, dense_id] * 2)
        assert compiled == 2
        assert st["dense_collectives_by_set"] == (
            {"dense set": 0, "sparse set": 2} if kept else {"dense set": 2, "sparse set": 0})
        assert [(u["config_id"], u["collectives"]) for u in st["sparse_images"]] == \
            [(f"{sparse_id:#010x}", 2)]


def test_planned_sparse_set_serves_the_dense_warm_up(server):
    """``plan_sparse`` (the DDP hook's dense warm-up): the first dense all-reduce already
    loads the planned sparse set, whose dense part is the MultiTree schedule's, and the
    sparse step after it needs no LOAD_CONFIG; results as the dense set's. A plan is
    validated like a request."""
    sched = algorithms.build("multitree", "ring:4")
    g = np.random.default_rng(4).standard_normal((WORLD, 64)).astype(np.float32)

    def rank(r):
        with open_nic("rtl", r, WORLD, algorithm=sched, **server.endpoint, timeout=10) as c:
            with pytest.raises(DriverError, match="density must be in"):
                c.plan_sparse("topka", 0.0)
            c.plan_sparse("topka", 0.25)
            t = g[r].copy()
            c.allreduce(t)
            ids = [c.config_id]
            c.sparse_allreduce(np.ones(64, np.float32), 0.25, scheme="topka")
            ids.append(c.config_id)
            return t, ids, None, c.status()
    out, errs = driver_helpers.run_threads(rank, WORLD)
    assert errs == [None] * WORLD, errs
    from treenic.schedule.execute import execute
    want = execute(sched, g)
    sparse_id = zlib.crc32(F.sparse_image_set("ring:4", "topka", 64, 0.25, 0).to_bytes())
    for r in range(WORLD):
        t, ids, _, st = out[r]
        assert np.array_equal(bits(t), bits(want[r])) and ids == [sparse_id] * 2
        assert st["dense_collectives_by_set"] == {"dense set": 0, "sparse set": 1}


# ---- the server refuses what the loaded program is not -------------------------------------

def test_sparse_start_refused_without_a_loaded_sparse_program(server):
    sched = algorithms.build("multitree", "ring:4")
    with hello(server) as c:
        assert load(c, driver_helpers.image_set(sched, N))[0] == P.Msg.CONFIG_ACK
        write(c, 1)
        text = expect_error(start(c, 1, 0.1), P.ErrorCode.NOT_READY)
        assert "no sparse program loaded" in text and "dense-only" in text
        assert "\n" not in text
        # nothing was taken: the staged buffer is still there for a START that runs
        assert 1 in next(iter(server.ranks.values()))["staged"]
    assert server.rendezvous.completed == 0


@pytest.mark.parametrize("density,options,scheme,seed,elements,code,differ", [
    (0.05, {}, MT, 0, N, "CONFIG_MISMATCH", "density"),
    (0.1, {"residual": "global"}, MT, 0, N, "CONFIG_MISMATCH", "residual"),
    (0.1, {"flow_assignment": "hash"}, MT, 0, N, "CONFIG_MISMATCH", "flow_assignment"),
    (0.1, {}, "topka", 0, N, "CONFIG_MISMATCH", "algorithm"),
    (0.1, {}, MT, 0, 500, "SIZE_MISMATCH", "elements"),
])
def test_sparse_start_not_the_loaded_program_is_refused(server, density, options, scheme,
                                                        seed, elements, code, differ):
    """One line naming both sides and what differs; nothing runs, nothing is recompiled,
    the staged buffer is kept."""
    images = sparse_set(0.1)
    cid = zlib.crc32(images.to_bytes())
    with hello(server) as c:
        assert load(c, images.to_bytes())[0] == P.Msg.CONFIG_ACK
        write(c, 1, elements)
        text = expect_error(start(c, 1, density, scheme, options, seed), P.ErrorCode[code])
    assert f"{cid:#010x}" in text and f"(they differ in {differ})" in text and "\n" not in text
    assert "density=0.1" in text and "nothing ran" in text
    assert server.rendezvous.completed == 0


def test_hash_seed_is_part_of_the_contract(server):
    images = sparse_set(0.1, flow_assignment="hash", seed=3)
    with hello(server) as c:
        assert load(c, images.to_bytes())[0] == P.Msg.CONFIG_ACK
        write(c, 1)
        text = expect_error(start(c, 1, 0.1, options={"flow_assignment": "hash"}, seed=4),
                            P.ErrorCode.CONFIG_MISMATCH)
    assert "(they differ in seed)" in text and "seed=3" in text and "seed=4" in text


@pytest.mark.parametrize("name", ["golden", "rtl"])
def test_both_engines_refuse_alike(name, monkeypatch):
    """The loaded program's parameters are the contract on the golden and the rtl engine:
    the same refusal, before anything runs."""
    if name == "rtl":
        # the constructor only checks that a fabric could be built; nothing is built here
        driver_helpers.stub_verilator(monkeypatch, {})
    data = sparse_set(0.1).to_bytes()
    _, engine = F.loaded_engine(name, data, WORLD)
    accs = np.zeros((WORLD, N), np.float32)
    with pytest.raises(FabricError, match=r"\(they differ in density\)") as e:
        engine.run_sparse(MT, accs, 0.2, 0, {"residual": "local",
                                             "flow_assignment": "contiguous"})
    assert e.value.code == "CONFIG_MISMATCH"
    _, dense = F.loaded_engine(name, driver_helpers.image_set(
        algorithms.build("multitree", "ring:4"), N), WORLD)
    with pytest.raises(FabricError, match="no sparse program loaded") as e:
        dense.run_sparse("topka", accs, 0.1, 0, {})
    assert e.value.code == "NOT_READY"


def test_golden_engine_runs_the_program_parameters():
    """The golden engine's sparse step is the golden model of the loaded program (the
    request matched it), labelled so."""
    data = sparse_set(0.1, flow_assignment="hash", residual="global", seed=9).to_bytes()
    _, engine = F.loaded_engine("golden", data, WORLD)
    accs = np.random.default_rng(1).standard_normal((WORLD, N)).astype(np.float32)
    got = engine.run_sparse(MT, accs, 0.1, 9, {"residual": "global",
                                                "flow_assignment": "hash"})
    want = make(MT, workers=WORLD, elements=N, density=0.1, seed=9, topology="ring:4",
                residual="global", flow_assignment="hash").step(accs)
    assert np.array_equal(bits(got.result), bits(want.result))
    assert np.array_equal(bits(got.residuals), bits(want.residuals))
    assert got.info["program"] == "loaded image set"


class _StandIn:
    """Stand-in for the Verilated fabric of combined NICs
    (:class:`treenic.hdl.nic.sparse_nic_sim.CombinedFabricSim`): records what it was built
    from and what ran; a sparse run is the program's golden model (7 cycles), a dense run
    the golden executor of the set's tables (5 cycles)."""
    built: list = []

    def __init__(self, images, program, **kw):
        self.images, self.program, self.runs = images, program, []
        _StandIn.built.append(self)

    def run_fresh(self, accs, seed=0):
        from treenic.schedule.sparse_table import program_golden
        import treenic.hdl.nic.sparse_nic_sim as sn
        self.runs.append(("sparse", self.program))
        res = program_golden(self.program, seed).step(np.asarray(accs, np.float32))
        res.info.update(engine=sn.ENGINE, cycles=7)
        return res, 7

    def dense(self, buffers):
        from treenic.firmware.image import decode_schedule
        from treenic.schedule.execute import execute
        self.runs.append(("dense", self.images))
        return execute(decode_schedule(self.images), buffers), 5


def _stand_in(monkeypatch):
    import treenic.hdl.nic.sparse_nic_sim as sn
    driver_helpers.stub_verilator(monkeypatch, {})
    _StandIn.built = []
    monkeypatch.setattr(sn, "CombinedFabricSim", _StandIn)
    return sn


def test_rtl_engine_hands_the_loaded_program_to_the_fabric(monkeypatch):
    """RTLEngine on a loaded sparse set builds ONE fabric of combined NICs from the set and
    its decoded program (the object LOAD_CONFIG checked), compiles nothing, and runs the
    set's sparse AND dense collectives on it; every result is labelled with that fabric.
    The Verilated fabric is a stand-in here (the real run: TREENIC_RTL_TESTS=1)."""
    import treenic.hdl.nic.sparse_sim as ss
    sn = _stand_in(monkeypatch)

    def no_compile(*a, **kw):
        raise AssertionError("the loaded program was recompiled")
    monkeypatch.setattr(ss, "imaged_model", no_compile)
    monkeypatch.setattr(ss, "sparse_model", no_compile)
    monkeypatch.setattr(F, "sparse_image_set", no_compile)
    data = sparse_set(0.05, flow_assignment="hash", seed=2).to_bytes()
    _, engine = F.loaded_engine("rtl", data, WORLD)
    opts = {"residual": "local", "flow_assignment": "hash"}
    accs = np.random.default_rng(2).standard_normal((WORLD, N)).astype(np.float32)
    for _ in range(2):
        res = engine.run_sparse(MT, accs, 0.05, 2, opts)
    out, cycles = engine.run(accs)
    [fab] = _StandIn.built
    assert fab.program is engine.sparse_program and fab.images is engine.images
    assert fab.runs == [("sparse", engine.sparse_program)] * 2 + [("dense", engine.images)]
    assert res.info["program"] == "loaded image set" and res.info["cycles"] == 7
    assert res.info["engine"] == sn.ENGINE == F.RTL_SPARSE_DESCRIPTION
    assert engine.description == engine.dense_description == engine.sparse_description \
        == F.RTL_SPARSE_DESCRIPTION
    assert cycles == 5 and out.shape == accs.shape      # the dense step: the same fabric


def test_rtl_engine_without_a_loaded_set_compiles_the_request(monkeypatch):
    """An engine no image set was loaded into (in-process) builds the fabric of combined
    NICs from the request's own image set (sparse_image_set), once per program; no refusal
    applies. Verilator build and run: stand-ins."""
    _stand_in(monkeypatch)
    engine = F.RTLEngine(algorithms.build("multitree", "ring:4"))
    assert engine.sparse_description == F.RTL_SPARSE_DESCRIPTION
    assert engine.dense_description.startswith("Verilated NIC fabric")
    accs = np.random.default_rng(4).standard_normal((WORLD, N)).astype(np.float32)
    for _ in range(2):
        got = engine.run_sparse("topka", accs, 0.05, 0)
    want = make("topka", workers=WORLD, elements=N, density=0.05, seed=0).step(accs)
    assert np.array_equal(bits(got.result), bits(want.result))
    assert "program" not in got.info and got.info["cycles"] == 7
    [fab] = _StandIn.built
    assert fab.program == decode_sparse_program(F.sparse_image_set("ring:4", "topka", N,
                                                                   0.05, 0))


# ---- LOAD_CONFIG checks the sparse section -----------------------------------------------

def _with_section(images: ImageSet, **changes) -> ImageSet:
    return ImageSet([dataclasses.replace(im, sparse=dataclasses.replace(im.sparse, **changes))
                     for im in images], images.topology)


def test_sparse_section_must_be_the_compilers_program(server):
    """A set whose sections are valid field by field but are not the compiler's program for
    the parameters they name (rows compiled for density 0.1, labelled 0.2; rows of another
    node) is BAD_CONFIG, one line."""
    images = sparse_set(0.1)
    relabelled = _with_section(images, density=0.2)
    with pytest.raises(ConfigRejected, match="rows are not the compiler's program"):
        parse_sparse_program(relabelled)
    swapped = ImageSet([dataclasses.replace(im, sparse=dataclasses.replace(
        im.sparse, rows=images[(u + 1) % WORLD].sparse.rows)) for u, im in enumerate(images)],
        images.topology)
    with pytest.raises(ConfigRejected, match="node 0's rows"):
        parse_sparse_program(swapped)
    with hello(server) as c:
        text = expect_error(load(c, relabelled.to_bytes()), P.ErrorCode.BAD_CONFIG)
    assert "not the compiler's program" in text and "\n" not in text
    got, _ = parse_image_set(images.to_bytes(), WORLD)
    assert parse_sparse_program(got) == decode_sparse_program(images)
    assert parse_sparse_program(compile_images("ring:4", "multitree", N)) is None


def test_old_protocol_client_told_why(server):
    """A version-3 client (its sparse START compiled by the server) learns what changed."""
    with socket.create_connection(server.address, timeout=5) as c:
        text = expect_error(req(c, P.Msg.HELLO, b"", version=3), P.ErrorCode.VERSION_MISMATCH)
    assert "version 3" in text and "sparse program of the loaded image set" in text


def test_train_probe_loads_the_set_the_server_will_run(monkeypatch):
    """``treenic train --engine rtl``'s sparse probe builds the fabric of combined NICs from
    the rank's sparse set through LOAD_CONFIG's checks (the build the server then finds
    cached)."""
    from treenic import train
    _stand_in(monkeypatch)
    cfg = train._config("rtl", density=0.05, scheme=MT, progress=False)
    notes = []
    train._probe_rtl_sparse(cfg, N, notes.append)
    opts = train._sparse_options(cfg)
    want = decode_sparse_program(F.sparse_image_set(cfg["topology"], MT, N, 0.05,
                                                    cfg["seed"], opts))
    [fab] = _StandIn.built
    assert fab.program == want
    assert "= 7 cycles" in notes[0]
    # 8 epochs of 22 steps less 20 dense warm-up steps, priced by a second (built) call
    assert "~156 sparse steps ≈" in notes[0]
    # a MultiTree run: the warm-up runs from the sparse set, so the probe times a dense
    # all-reduce on the same fabric of combined NICs too
    sched = algorithms.build("multitree", cfg["topology"])
    assert train._dense_on_combined(cfg, sched)
    assert not train._dense_on_combined(cfg, algorithms.build("ring", cfg["topology"]))
    train._probe_rtl_sparse(cfg, N, notes.append, dense=True)
    assert _StandIn.built[-1].runs[0][0] == "dense"
    assert "dense all-reduce on the same fabric = 5 cycles" in notes[1]
    assert notes[1].startswith(f"NOTICE: {F.RTL_SPARSE_DESCRIPTION}")
