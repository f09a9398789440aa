"""tools/congestion_cells.py: the join of router2's congestion map and a placed netlist."""
import importlib.util
import json
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "congestion_cells.py"
spec = importlib.util.spec_from_file_location("congestion_cells", TOOL)
cc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cc)


def _placed(tmp_path):
    cells = {"board.nic.buf.a": ("TRELLIS_COMB", "X1/Y2/SLICEA"),
             "board.nic.buf.b": ("TRELLIS_FF", "X1/Y2/SLICEB"),
             "board.nic.buf.c": ("TRELLIS_COMB", "X0/Y0/SLICEA"),
             "board.nic.rx0.d": ("TRELLIS_COMB", "X1/Y2/SLICEC"),
             "board.eth.core.e": ("TRELLIS_COMB", "X2/Y1/SLICEA"),
             "board.link0.io": ("TRELLIS_IO", "X1/Y2/PIOA")}       # not a logic cell
    d = {"modules": {"top": {"cells": {n: {"type": t, "attributes": {"NEXTPNR_BEL": b}}
                                       for n, (t, b) in cells.items()}}}}
    (tmp_path / "placed.json").write_text(json.dumps(d))
    (tmp_path / "heat.csv").write_text("0,0,0,\n0,0,20,\n0,3,0,\n")   # X rows, Y columns
    return tmp_path / "heat.csv", tmp_path / "placed.json", d


def test_counts_cells_per_block_on_hot_tiles(tmp_path):
    heat, placed, d = _placed(tmp_path)
    tiles, on_hot, total = cc.cells_on_hot_tiles(cc.read_heatmap(heat), d, 15, 3)
    assert tiles == 1                                   # only (1, 2) reaches 15
    assert on_hot == {"board.nic.buf": 2, "board.nic.rx0": 1}
    assert total == {"board.nic.buf": 3, "board.nic.rx0": 1, "board.eth.core": 1}
    tiles, on_hot, _ = cc.cells_on_hot_tiles(cc.read_heatmap(heat), d, 3, 2)
    assert tiles == 2 and on_hot == {"board.nic": 3, "board.eth": 1}


def test_cli_output_and_bad_input(tmp_path, capsys):
    heat, placed, _ = _placed(tmp_path)
    assert cc.main([str(heat), str(placed)]) == 0
    out = capsys.readouterr().out
    assert "1 tiles with >= 15 overused wires; 3 of 5 logic cells" in out
    assert "2 of       3  board.nic.buf" in out
    assert cc.main([str(heat), str(tmp_path / "missing.json")]) == 1
    assert "error" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cc.main([str(heat), str(placed), "--threshold", "0"])
