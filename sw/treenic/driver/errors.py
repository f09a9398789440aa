"""Exceptions of the host driver (one hierarchy for every backend)."""
from __future__ import annotations


class DriverError(RuntimeError):
    """Bad use of the driver: wrong dtype/size, world mismatch, unknown backend."""


class BadTensor(DriverError):
    """This rank's tensor cannot take part in a collective (dtype, size, read-only). The
    driver tells the other ranks before raising, so they fail at once naming this rank."""


class FabricError(DriverError):
    """The fabric (server, in-process fabric, or peers) reported or hit an error."""

    def __init__(self, message: str, code=None):
        super().__init__(message)
        self.code = code


class FabricTimeout(FabricError):
    """The fabric or the other ranks stopped answering; names the rank and the step."""


class FabricDisconnected(FabricError):
    """The fabric server closed the connection (killed, crashed, or refused the framing)."""


class RTLFabricUnavailable(FabricError):
    """The Verilated RTL fabric is not built / not importable. Never replaced by a fake:
    callers either fail or fall back explicitly (and say so) to the golden model."""
