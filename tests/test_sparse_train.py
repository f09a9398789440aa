"""Sparse training through the driver: honest engine labels, the NIC options of a sparse
request (protocol v3 START byte), the rtl engine's refusal of a scheme it does not run (no
silent fallback), the DGC techniques of the DDP hook; and the end-to-end RTL training run,
skipped (with the reason) while the RTL does not run MultiTree-Sparse."""
import argparse
import json
import socket
import struct

import numpy as np
import pytest
import torch

import driver_helpers
from treenic import algorithms, train
from treenic.ddp import TreenicHookState, _ramp_stages, treenic_hook
from treenic.driver import LocalFabric, open_nic
from treenic.driver import fabric as F
from treenic.driver import protocol as P
from treenic.driver.errors import DriverError, FabricError
from treenic.driver.server import FabricServer
from treenic.sparse.base import REGISTRY, make

WORLD = 4
N = 1000


def grads(seed, n=N):
    return np.random.default_rng(seed).standard_normal((WORLD, n)).astype(np.float32)


@pytest.fixture
def server():
    srv = FabricServer(WORLD, "golden", collective_timeout=10.0, idle_timeout=30.0)
    srv.start_thread()
    yield srv
    srv.stop()


def bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


# ---- the rtl engine never hands a sparse scheme to the golden models -----------------------

def test_rtl_engine_names_schemes_it_does_not_run():
    missing = [s for s in REGISTRY if s not in F.RTLEngine.SPARSE_SCHEMES]
    assert missing                                  # zen, sparcml, ... are not in the NIC
    for s in missing:
        reason = F.rtl_sparse_unsupported(s)
        assert repr(s) in reason and "rtl engine" in reason and "\n" not in reason
    assert F.GoldenEngine(algorithms.build("multitree", "ring:4")).sparse_unsupported("zen") \
        is None


def test_rtl_engine_names_option_values_it_does_not_run(monkeypatch):
    # the RTL runs both residuals now; the check itself, on an engine that ran local only
    assert F.rtl_sparse_unsupported("multitree-sparse", {"residual": "global"}) is None
    monkeypatch.setattr(F.RTLEngine, "SPARSE_SCHEMES", ("multitree-sparse",))
    monkeypatch.setattr(F.RTLEngine, "SPARSE_OPTION_VALUES",
                        dict(F.RTLEngine.SPARSE_OPTION_VALUES, residual=("local",)))
    assert F.rtl_sparse_unsupported("multitree-sparse", {"residual": "local"}) is None
    reason = F.rtl_sparse_unsupported("multitree-sparse", {"residual": "global"})
    assert "residual local only, not 'global'" in reason
    cfg = train._config("rtl", density=0.01, scheme="multitree-sparse", progress=False,
                        residual="global")
    with pytest.raises(ValueError, match="not 'global'"):
        train._sparse_engine_check(cfg, log=lambda *a: None)


def test_train_rtl_sparse_scheme_is_an_error_unless_fallback_asked():
    """Old behaviour: the run silently switched to the golden engine, labelled ``rtl/...``."""
    cfg = train._config("rtl", density=0.01, scheme="zen", progress=False)
    cfg["requested_engine"] = cfg["engine"]
    with pytest.raises(ValueError, match="rtl engine does not run sparse scheme 'zen'"):
        train._sparse_engine_check(cfg, log=lambda *a: None)
    notes = []
    cfg = train._config("rtl", density=0.01, scheme="zen", progress=False,
                        sparse_fallback=True)
    train._sparse_engine_check(cfg, log=notes.append)
    assert cfg["engine"] == "golden" and "golden engine" in cfg["fallback"]
    assert not cfg["label"].startswith("rtl/") and "golden" in cfg["label"]
    assert notes and "NOTICE" in notes[0] and "--sparse-fallback" in notes[0]


def test_cli_train_rtl_unsupported_scheme_one_line_error(capsys):
    from treenic import cli
    rc = cli.main(["train", "--backend", "rtl", "--density", "0.01", "--scheme", "zen",
                   "--epochs", "1", "--json"])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and "rtl engine does not run sparse scheme 'zen'" in err
    assert len(err.splitlines()) == 1


def test_cli_rejects_options_the_scheme_lacks(capsys):
    from treenic import cli
    rc = cli.main(["train", "--backend", "model", "--density", "0.01", "--scheme", "topka",
                   "--residual", "global", "--epochs", "1"])
    assert rc != 0 and "scheme 'topka' has no such option" in capsys.readouterr().err
    rc = cli.main(["train", "--backend", "model", "--density", "0.01", "--scheme",
                   "multitree-sparse", "--algorithm", "ring", "--epochs", "1"])
    assert rc != 0 and "MultiTree schedule" in capsys.readouterr().err


# ---- the sparse request carries the NIC options -------------------------------------------

def test_sparse_options_byte_roundtrip_and_validation():
    for residual in ("local", "global"):
        for flow in ("contiguous", "hash"):
            o = {"residual": residual, "flow_assignment": flow}
            assert P.unpack_sparse_options(P.pack_sparse_options(o)) == o
    assert P.unpack_sparse_options(0x04) is None
    mt = algorithms.build("multitree", "ring:4")
    with pytest.raises(DriverError, match="has no option residual='global'"):
        F.check_sparse_request("topka", {"residual": "global"}, mt)
    with pytest.raises(DriverError, match="must be one of"):
        F.check_sparse_request("multitree-sparse", {"residual": "nearby"}, mt)
    with pytest.raises(DriverError, match="unknown sparse option"):
        F.check_sparse_request("multitree-sparse", {"decay": 0.5}, mt)
    with pytest.raises(DriverError, match="loaded schedule is 'ring'"):
        F.check_sparse_request("multitree-sparse", {}, algorithms.build("ring", "ring:4"))
    assert F.check_sparse_request("topka", {"residual": "local"}, mt) == {}


@pytest.mark.parametrize("options", [{"residual": "global", "flow_assignment": "hash"},
                                     {"residual": "local", "flow_assignment": "contiguous"}])
def test_options_reach_the_model_over_the_server(server, options):
    """rtl backend (fabric server, golden engine): results and residuals are the golden
    model's with the requested options on the loaded schedule's topology, bit for bit."""
    sched = algorithms.build("multitree", "ring:4")
    g = grads(7)

    def rank(r):
        with open_nic("rtl", r, WORLD, algorithm=sched, **server.endpoint, timeout=10) as c:
            t = torch.from_numpy(g[r].copy())
            out = c.sparse_allreduce(t, 0.05, scheme="multitree-sparse",
                                     residual=torch.zeros(N), seed=3, options=options)
            return t.numpy().copy(), out.residual.numpy().copy(), c.status()
    out, errs = driver_helpers.run_threads(rank, WORLD)
    assert errs == [None] * WORLD, errs
    ref = make("multitree-sparse", workers=WORLD, elements=N, density=0.05, seed=3,
               topology="ring:4", **options).step(g)
    for r in range(WORLD):
        assert np.array_equal(bits(out[r][0]), bits(ref.result[r]))
        assert np.array_equal(bits(out[r][1]), bits(ref.residuals[r]))
        assert out[r][2]["sparse_engine"] == F.GoldenEngine.sparse_description


def test_server_refuses_bad_option_bits_and_unserved_scheme(server, monkeypatch):
    sched = algorithms.build("multitree", "ring:4")
    with socket.create_connection(server.address, timeout=5) as s:
        hello = P.HELLO.pack(P.PROTOCOL_VERSION, 0, WORLD, 0, bytes.fromhex(server.secret))
        assert driver_helpers.req(s, P.Msg.HELLO, hello)[0] == P.Msg.HELLO_ACK
        reply = driver_helpers.load(s, driver_helpers.image_set(sched))
        assert reply[0] == P.Msg.CONFIG_ACK
        data = np.zeros(8, "<f4").tobytes()
        wr = P.BUFFER.pack(1, P.DTYPE_FLOAT32, P.BUF_GRADIENT, 0, 8) + data
        assert driver_helpers.req(s, P.Msg.WRITE_BUFFER, wr)[0] == P.Msg.WRITE_ACK

        def start(bits_, scheme=b"multitree-sparse", mode=P.MODE_SPARSE):
            return driver_helpers.req(s, P.Msg.START, P.START.pack(
                1, mode, bits_, len(scheme), 0.5, 0) + scheme)
        driver_helpers.expect_error(start(0x80), P.ErrorCode.BAD_PAYLOAD)
        t = driver_helpers.expect_error(start(0x01, b"topka"), P.ErrorCode.BAD_PAYLOAD)
        assert "has no option residual='global'" in t
        driver_helpers.expect_error(start(0x01, b"", P.MODE_DENSE), P.ErrorCode.BAD_PAYLOAD)
        monkeypatch.setattr(F.GoldenEngine, "sparse_unsupported",
                            lambda self, scheme, options: f"engine does not run {scheme!r}")
        t = driver_helpers.expect_error(start(0x00), P.ErrorCode.ENGINE)
        assert t == "engine does not run 'multitree-sparse'"


def test_client_rejects_bad_options_before_sending(server):
    sched = algorithms.build("multitree", "ring:4")
    c = open_nic("rtl", 0, WORLD, algorithm=sched, **server.endpoint, timeout=5)
    with c, pytest.raises(DriverError, match="must be one of"):
        c.sparse_allreduce(np.zeros(N, np.float32), 0.1, scheme="multitree-sparse",
                           options={"flow_assignment": "random"})
    assert c.counters.sparse_collectives == 0


# ---- DGC techniques in the hook -----------------------------------------------------------

class Bucket:
    def __init__(self, tensor):
        self._t = tensor

    def buffer(self):
        return self._t

    def index(self):
        return 0

    def is_last(self):
        return True


def run_hook(states, g):
    def rank(r):
        return treenic_hook(states[r], Bucket(torch.from_numpy(g[r].copy()))).value().numpy()
    out, errs = driver_helpers.run_threads(rank, WORLD)
    assert errs == [None] * WORLD, errs
    return out


def test_momentum_correction_dense_is_sgd_momentum_then_masked_sparse():
    fabric = LocalFabric(algorithms.build("multitree", "ring:4"), timeout=10)
    states = [TreenicHookState(open_nic("model", r, WORLD, algorithm=fabric.schedule,
                                        fabric=fabric), scheme="multitree-sparse",
                               density=0.02, warmup_iters=2, momentum=0.9)
              for r in range(WORLD)]
    u = np.zeros(N, np.float32)
    for it in range(2):                              # dense: u = 0.9 u + mean(g)
        g = grads(it)
        out = run_hook(states, g)
        mean = algorithms_sum(fabric, g) / np.float32(WORLD)
        u = np.float32(0.9) * u + mean
        for r in range(WORLD):
            assert np.array_equal(bits(out[r]), bits(u))
    g = grads(5)
    out = run_hook(states, g)                        # sparse: v = 0 + (0.9 u + g_r)
    acc = np.float32(0.9) * u + g
    ref = make("multitree-sparse", workers=WORLD, elements=N, density=0.02,
               topology="ring:4").step(acc)
    for r in range(WORLD):
        assert np.array_equal(bits(out[r]), bits(ref.result[r] / np.float32(WORLD)))
        res = states[r].error_dict[0].numpy()
        assert np.array_equal(bits(res), bits(ref.residuals[r]))
        vel = states[r].velocity[0].numpy()
        sent = (acc[r] != 0) & (res == 0)
        assert sent.any() and np.all(vel[sent] == 0)
        assert np.array_equal(bits(vel[~sent]), bits(acc[r][~sent]))


def algorithms_sum(fabric, g):
    from treenic.schedule.execute import execute
    return execute(fabric.schedule, g)[0]


def test_ramp_warmup_and_clipping():
    assert _ramp_stages(0.01) == [0.25, 0.0625, 0.015625]
    assert _ramp_stages(0.5) == [0.5]
    st = TreenicHookState(None, scheme="topka", density=0.01, warmup_iters=6, warmup="ramp")
    seen = []
    for it in range(8):
        st.iter = it
        seen.append(st.current_density())
    assert seen == [0.25, 0.25, 0.0625, 0.0625, 0.015625, 0.015625, 0.01, 0.01]
    assert st.sparse_active
    with pytest.raises(ValueError, match="warmup must be one of"):
        TreenicHookState(None, scheme="topka", warmup="linear")
    with pytest.raises(ValueError, match="clip_norm"):
        TreenicHookState(None, scheme="topka", clip_norm=0.0)
    from treenic.ddp import _clip_local
    st = TreenicHookState(None, scheme="topka", clip_norm=2.0)
    t = torch.full((16,), 1.0)                       # norm 4 > 2 / sqrt(4) = 1
    _clip_local(st, t, 4)
    assert abs(float(t.norm()) - 1.0) < 1e-6


# ---- training through the RTL (runs once the NIC runs MultiTree-Sparse) ------------------

def _rtl_flow_assignment():
    """The training's default flow assignment when the RTL runs it, else one it runs."""
    runs = F.RTLEngine.SPARSE_OPTION_VALUES["flow_assignment"]
    return train.SPARSE_DEFAULTS["flow_assignment"] if \
        train.SPARSE_DEFAULTS["flow_assignment"] in runs else runs[0]


def _rtl_sparse_skip_reason(flow):
    sched = algorithms.build("multitree", "ring:4")
    return F.rtl_unavailable_reason(sched) or F.rtl_sparse_unsupported(
        "multitree-sparse", {"residual": "local", "flow_assignment": flow})


@pytest.mark.slow
def test_train_rtl_multitree_sparse_end_to_end(tmp_path, capsys):
    """`treenic train --backend rtl --density 0.01 --scheme multitree-sparse --json`: the
    dense warm-up and the sparse steps run on one Verilated fabric of combined NICs and the
    JSON says so (no fallback)."""
    flow = _rtl_flow_assignment()
    reason = _rtl_sparse_skip_reason(flow)
    if reason:
        pytest.skip(f"RTL cannot train MultiTree-Sparse here: {reason}")
    ap = argparse.ArgumentParser()
    train.add_arguments(ap)
    args = ap.parse_args(["--backend", "rtl", "--density", "0.01", "--scheme",
                          "multitree-sparse", "--epochs", "1", "--warmup-iters", "5",
                          "--flow-assignment", flow, "--out", str(tmp_path), "--json"])
    assert train.main(args) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["fallback"] is None and s["backend"] == "rtl"
    assert s["engine"] == s["sparse_engine"] == F.RTL_SPARSE_DESCRIPTION
    # the dense warm-up ran from the sparse steps' set: the same fabric of combined NICs
    assert s["dense_engine"] == F.RTL_SPARSE_DESCRIPTION and s["sparse_calls"] > 0
    by_set = s["dense_collectives_by_set"]
    assert by_set["dense set"] == 0 and by_set["sparse set"] >= s["dense_calls"] > 0
    assert s["cycles"] > 0
    # the sparse steps ran the loaded image set's program (issue 17): one set, all steps
    assert [(i["scheme"], i["density"], i["flow_assignment"], i["collectives"])
            for i in s["sparse_images"]] == [("multitree-sparse", 0.01, flow, s["sparse_calls"])]
    assert s["sparse_training"]["sparse_options"]["flow_assignment"] == flow
    assert s["params_identical_across_ranks"]
