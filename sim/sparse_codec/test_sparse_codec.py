"""``make sim`` entry for the sparse message codec (encoder and decoder, C = 200)."""
import pytest

from harness import run_bench, sim_name
from treenic.hdl.sparse.codec import SparseDecoder, SparseEncoder


@pytest.mark.parametrize("unit", ["encoder", "decoder"])
def test_sparse_codec_bench(unit):
    messages = 60 if sim_name() == "verilator" else 15
    cls = SparseEncoder if unit == "encoder" else SparseDecoder
    run_bench(cls(max_chunk=256), name=f"sparse_codec_{unit}", test_module="sparse_codec_tb",
              params={"unit": unit, "chunk": 200, "messages": messages})
