"""NIC link layer: flit format, packetiser, depacketiser, link model, golden models.

See :mod:`treenic.hdl.link.flit` for the bit layout and :mod:`treenic.hdl.link.model` for
the golden semantics.
"""

from .flit import (FlitType, Op, ErrorCause, FlitFormat, LinkSignature, N_CAUSES,
                   WORD_BITS)
from .model import (packetise, depacketise, efficiency, efficiency_report, MESSAGE,
                    PACKET)

__all__ = ["FlitType", "Op", "ErrorCause", "FlitFormat", "LinkSignature", "N_CAUSES",
           "WORD_BITS", "packetise", "depacketise", "efficiency", "efficiency_report",
           "MESSAGE", "PACKET"]
