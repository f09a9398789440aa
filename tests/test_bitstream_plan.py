"""The board bitstream's build plan: ``make bitstream BOARD=ecpix5`` builds the plan that
routes (``ecpix5.BITSTREAM_PLAN``: 62.5 MHz, shared buffer ports, 4 banks, router2) unless
the command line says otherwise; other boards take nothing from it; bad combinations are
refused in one line."""
import pytest

from treenic.boards import bitstream
from treenic.boards.ecpix5 import BITSTREAM_PLAN, CLOCK_PLANS


def _args(*argv):
    ap_args = bitstream.argparse.Namespace(
        board="ecpix5", small=False, nic_mhz=None, banks=None, shared_ports=None,
        nextpnr_opts=None)
    for k, v in zip(argv[::2], argv[1::2]):
        setattr(ap_args, k, v)
    bitstream._board_plan(ap_args)
    return ap_args


def test_ecpix5_defaults_to_the_routable_plan(capsys):
    a = _args()
    assert (a.nic_mhz, a.shared_ports, a.banks, a.nextpnr_opts) == (
        62.5, True, 4, "--router router2")
    assert BITSTREAM_PLAN["nic_mhz"] in CLOCK_PLANS
    assert "plan: nic_mhz=62.5" in capsys.readouterr().err     # said, not silent


def test_command_line_overrides_the_plan():
    a = _args("nic_mhz", 125, "shared_ports", False, "nextpnr_opts", "--seed 2")
    assert (a.nic_mhz, a.shared_ports, a.banks, a.nextpnr_opts) == (125, False, 4, "--seed 2")


def test_other_boards_take_no_plan():
    a = _args("board", "colorlight")
    assert (a.nic_mhz, a.shared_ports, a.banks, a.nextpnr_opts) == (None, False, None, "")


def test_shared_ports_refused_on_colorlight(capsys):
    with pytest.raises(SystemExit) as e:
        bitstream.main(["--board", "colorlight", "--shared-ports", "--area-only"])
    assert e.value.code == 2
    assert "--shared-ports: the colorlight top's NIC" in capsys.readouterr().err
