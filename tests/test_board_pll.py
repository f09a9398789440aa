"""The board tops' EHXPLLL (``treenic.boards.core.ecp5_pll``): the dividers each board
passes give the clocks the tops are built for (ECP5 with CLKOP feedback:
CLKOP = CLKI·CLKFB_DIV/CLKI_DIV, VCO = CLKOP·CLKOP_DIV in 400..800 MHz, CLKOSx = VCO/DIV)."""
import pytest
from amaranth.hdl import Module, Signal

from treenic.boards import colorlight, ecpix5
from treenic.boards.core import ecp5_pll


def _pll(pll, mhz):
    m = Module()
    ecp5_pll(m, Signal(), pll, clki_mhz=mhz)
    inst = m._named_submodules["pll"]
    return inst[0] if isinstance(inst, tuple) else inst


@pytest.mark.parametrize("board,mhz,sync90", [(ecpix5, 100, True), (colorlight, 25, False)])
def test_pll_gives_the_nic_and_eth_clocks(board, mhz, sync90):
    p = {k: v.value if hasattr(v, "value") else v for k, v in _pll(board.PLL, mhz).parameters.items()}
    clkop = mhz * p["CLKFB_DIV"] / p["CLKI_DIV"]
    vco = clkop * p["CLKOP_DIV"]
    assert clkop * 1e6 == board.NIC_CLOCK_HZ
    assert 400 <= vco <= 800
    assert vco / p["CLKOS_DIV"] * 1e6 == board.ETH_CLOCK_HZ
    attrs = _pll(board.PLL, mhz).attrs            # what nextpnr derives constraints from
    assert float(attrs["FREQUENCY_PIN_CLKOP"]) == pytest.approx(board.NIC_CLOCK_HZ / 1e6)
    assert float(attrs["FREQUENCY_PIN_CLKOS"]) == pytest.approx(board.ETH_CLOCK_HZ / 1e6,
                                                                rel=1e-5)
    assert ("CLKOS2_DIV" in p) == sync90
    if sync90:                       # the NIC clock, a quarter period behind CLKOP
        assert vco / p["CLKOS2_DIV"] * 1e6 == board.NIC_CLOCK_HZ
        lag = (p["CLKOS2_CPHASE"] - (p["CLKOS2_DIV"] - 1) + p["CLKOS2_FPHASE"] / 8) / vco
        assert lag * 1e3 == pytest.approx(1e9 / board.NIC_CLOCK_HZ / 4)


@pytest.mark.parametrize("nic_mhz", sorted(ecpix5.CLOCK_PLANS))
def test_every_ecpix5_clock_plan(nic_mhz):
    """Each NIC clock plan: CLKOP and CLKOS2 at the NIC clock (CLKOS2 90° behind), LiteEth's
    clock on CLKOS (fast enough for 1 Gb/s on its 32-bit datapath), the VCO in range; an
    unknown clock is refused."""
    p = ecpix5.CLOCK_PLANS[nic_mhz]
    _pll(p, 100)                                     # refuses a VCO out of range
    clkop = 100 * p["CLKFB_DIV"] / p["CLKI_DIV"]
    vco = clkop * p["CLKOP_DIV"]
    assert clkop == nic_mhz and vco / p["CLKOS2_DIV"] == nic_mhz
    assert vco / p["CLKOS_DIV"] * 1e6 == ecpix5.eth_clock_hz(nic_mhz) >= 1e9 / 32
    assert ecpix5.eth_clock_hz() == ecpix5.ETH_CLOCK_HZ
    lag = (p["CLKOS2_CPHASE"] - (p["CLKOS2_DIV"] - 1) + p["CLKOS2_FPHASE"] / 8) / vco
    assert lag == pytest.approx(1 / nic_mhz / 4)
    assert ecpix5.ECPIX5Top(params=None, verilog=None, nic_mhz=nic_mhz).pll == p
    with pytest.raises(ValueError, match="no PLL plan"):
        ecpix5.ECPIX5Top(params=None, verilog=None, nic_mhz=nic_mhz + 1)


def test_bitstream_refuses_an_unknown_nic_clock(capsys):
    from treenic.boards import bitstream
    for argv in (["--board", "ecpix5", "--nic-mhz", "90"],
                 ["--board", "colorlight", "--nic-mhz", "100"]):
        with pytest.raises(SystemExit) as e:
            bitstream.main(argv)
        assert e.value.code == 2 and "--nic-mhz" in capsys.readouterr().err
    for argv in (["--board", "ecpix5", "--banks", "3"], ["--board", "ecpix5", "--banks", "1"],
                 ["--board", "colorlight", "--banks", "4"]):
        with pytest.raises(SystemExit) as e:
            bitstream.main(argv)
        assert e.value.code == 2 and "--banks" in capsys.readouterr().err


@pytest.mark.parametrize("board", ["colorlight", "ecpix5"])
def test_board_build_needs_no_programmer(board):
    """Building a bitstream never flashes, so openFPGALoader (amaranth-boards' 5A-75B
    programmer) must not be a required tool: a build host without it failed at once."""
    pytest.importorskip("amaranth_boards")
    plat = {"colorlight": colorlight.colorlight_platform,
            "ecpix5": ecpix5.ecpix5_platform}[board]()
    assert "openFPGALoader" not in plat.required_tools
    assert "nextpnr-ecp5" in plat.required_tools


def test_pll_refuses_a_vco_out_of_range():
    with pytest.raises(ValueError, match="VCO 250 MHz outside"):
        ecp5_pll(Module(), Signal(), dict(CLKI_DIV=1, CLKFB_DIV=5, CLKOP_DIV=2, CLKOS_DIV=4),
                 clki_mhz=25)
