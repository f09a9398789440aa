"""cocotb-side agents for the link benches.

All agents take part in one per-cycle loop (:func:`run_cycles`): at the falling edge every
agent drives its inputs (``drive``), then in the read-only phase every agent samples the
settled signals (``sample``) -- a handshake seen there happens at the next rising edge.
This keeps ready/valid bookkeeping exact on Icarus and Verilator alike.
"""

import json
import os

from cocotb.triggers import FallingEdge, ReadOnly

from treenic.hdl.link import model
from treenic.hdl.link.flit import ErrorCause, FlitFormat


def kick_comb(dut):
    """Work around Icarus 11 never running Yosys-emitted ``always @*`` blocks whose inputs
    do not change after time 0 (their outputs stay X, e.g. ``hdr__ready`` in the idle
    state): Yosys puts a dummy ``dump_module$1`` reg into every such block's sensitivity
    list; changing it once evaluates all of them.  Harmless on Verilator."""
    for h in dut:
        name = getattr(h, "_name", "")
        if "dump_module" in name:
            try:
                h.value = 1
            except Exception:  # pragma: no cover - simulator without access
                pass


def fmt_from(p) -> FlitFormat:
    return FlitFormat(**p.get("fmt", {}))


def u(sig) -> int:
    """Integer value of a (multi-bit) signal (fails loudly on X/Z)."""
    v = sig.value
    try:
        return int(v)
    except ValueError:
        raise AssertionError(f"{sig._name} = {v} (X/Z)") from None


def rand_header(rng, n, fmt):
    return dict(vc=rng.randrange(fmt.vcs), next=rng.randrange(fmt.ports),
                eject=rng.randrange(fmt.ports), dest=rng.randrange(fmt.nodes),
                src=rng.randrange(fmt.nodes), flow=rng.randrange(fmt.flows),
                op=rng.choice([1, 2]), step=rng.randrange(fmt.steps),
                offset=rng.randrange(1 << fmt.offset_bits), length=n)


def rand_messages(rng, count, max_words, fmt, min_words=1):
    out = []
    for _ in range(count):
        n = rng.randint(min_words, max_words)
        out.append((rand_header(rng, n, fmt), [rng.getrandbits(32) for _ in range(n)]))
    return out


def interleave(streams, rng):
    streams = [list(x) for x in streams]
    out = []
    while any(streams):
        s = rng.choice([x for x in streams if x])
        out.append(s.pop(0))
    return out


class Source:
    """ready/valid source with random idle cycles (valid held until accepted)."""

    def __init__(self, dut, prefix, items, rng, p_idle):
        self.valid = getattr(dut, f"{prefix}__valid")
        self.payload = getattr(dut, f"{prefix}__payload")
        self.ready = getattr(dut, f"{prefix}__ready")
        self.items, self.rng, self.p_idle = list(items), rng, p_idle
        self.i = 0
        self.offering = False
        self.valid.value = 0

    @property
    def done(self):
        return self.i >= len(self.items)

    def drive(self):
        if not self.offering and not self.done and self.rng.random() >= self.p_idle:
            self.offering = True
            self.payload.value = self.items[self.i]
        self.valid.value = int(self.offering)

    def sample(self):
        if self.offering and u(self.ready):
            self.offering = False
            self.i += 1


class Sink:
    """ready/valid sink with random backpressure; collects payload ints."""

    def __init__(self, dut, prefix, rng, p_stall):
        self.valid = getattr(dut, f"{prefix}__valid")
        self.payload = getattr(dut, f"{prefix}__payload")
        self.ready = getattr(dut, f"{prefix}__ready")
        self.rng, self.p_stall = rng, p_stall
        self.got = []
        self.ready.value = 0
        self._r = 0

    def drive(self):
        self._r = int(self.rng.random() >= self.p_stall)
        self.ready.value = self._r

    def sample(self):
        if self._r and u(self.valid):
            self.got.append(u(self.payload))


class FragmentAssembler:
    """Turns the depacketiser's hdr/data streams into golden-comparable fragments."""

    def __init__(self, fmt, hdr_sink, data_sink):
        self.fmt, self.hs, self.ds = fmt, hdr_sink, data_sink

    def fragments(self):
        fmt = self.fmt
        frags, beats = [], list(self.ds.got)
        pos = 0
        for h in self.hs.got:
            hd = fmt.unpack_header(h)
            nb = -(-hd["length"] // fmt.lanes)
            words = []
            for j, b in enumerate(beats[pos:pos + nb]):
                last = (b >> fmt.width) & 1
                assert last == (j == nb - 1), f"data.last misplaced in fragment {hd}"
                words += fmt.unpack_words(b)
            pos += nb
            frags.append(model.Fragment(hd, words[:hd["length"]]))
        return frags, len(beats) - pos


def by_vc(frags, fmt):
    return {vc: [f.key() for f in frags if f.header["vc"] == vc] for vc in range(fmt.vcs)}


async def run_cycles(clk, agents, until, max_cycles, settle=0):
    """Per-cycle loop; returns the number of cycles run.  ``until()`` ends it (after
    ``settle`` more cycles); exceeding ``max_cycles`` is a failure (deadlock)."""
    n = 0
    left = None
    while True:
        await FallingEdge(clk)
        for a in agents:
            a.drive()
        await ReadOnly()
        for a in agents:
            a.sample()
        n += 1
        if left is None and until():
            left = settle
        if left is not None:
            if left == 0:
                return n
            left -= 1
        assert n < max_cycles, f"no progress after {max_cycles} cycles (deadlock?)"


def status_counts(dut, prefix="status"):
    v = u(getattr(dut, f"{prefix}__counts"))
    return [(v >> (16 * i)) & 0xFFFF for i in range(len(ErrorCause))]


def check_error_counts(dut, errs, prefix="status"):
    counts = status_counts(dut, prefix)
    for c in ErrorCause:
        if c == ErrorCause.NONE:
            continue
        want = 0 if c == ErrorCause.OVERFLOW else errs[c]
        assert counts[int(c)] == want, f"{c.name}: RTL {counts[int(c)]} != golden {want}"
    assert counts[0] == sum(errs[c] for c in ErrorCause if c != ErrorCause.NONE)
    assert u(getattr(dut, f"{prefix}__dropped")) == errs["dropped"]


def write_result(name, obj):
    """Save a JSON result next to the bench build (build/sim/<bench>/)."""
    d = os.environ.get("TREENIC_LINK_RESULTS")
    if d:
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, name), "w") as f:
            json.dump(obj, f, indent=1)
