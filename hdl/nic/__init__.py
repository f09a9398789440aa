"""treenic NIC core: schedule management, DMA, link ports, in-NIC reduction, fabric.

The core is built from components (see ``docs/nic-components.md``): HostRegs, TableScan,
FlowTable, Issue, TxUnit, RxUnit (OrderGate, Accumulate), ErrorCollect, BankedBuffer; with
``NicParams(sparse=SparseParams(...))`` also the sparse engine (LinkShare, SparseHost)."""
from .params import (NicParams, Reg, PortCounter, ErrBit, Ctrl, Status, ID_VALUE,
                     SparseParams, SparseStatus)
from .core import Nic, HostSignature, HOST_READ_LATENCY
from .buffer import BankedBuffer
from .errors import ErrorCollect
from .flow_table import FlowTable
from .host_regs import HostRegs
from .issue import Issue
from .rx import Accumulate, OrderGate, RxUnit
from .scan import TableScan
from .tx import TxUnit

__all__ = ["NicParams", "SparseParams", "SparseStatus", "Reg", "PortCounter", "ErrBit", "Ctrl", "Status", "ID_VALUE",
           "Nic", "HostSignature", "HOST_READ_LATENCY", "BankedBuffer",
           "ErrorCollect", "FlowTable", "HostRegs", "Issue", "Accumulate", "OrderGate",
           "RxUnit", "TableScan", "TxUnit"]
