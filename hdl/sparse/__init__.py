"""Sparse hardware units: MurmurHash3 hash unit, streaming top-k selection, scatter-accumulate.

Each unit is an ``amaranth.lib.wiring.Component`` with ``amaranth.lib.stream`` ports and is
verified bit for bit against the golden functions in ``treenic.sparse`` (see
``docs/sparse-units.md``).
"""
