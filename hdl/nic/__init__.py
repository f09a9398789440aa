"""treenic NIC core: schedule management, DMA, link ports, in-NIC reduction, fabric."""
from .params import NicParams, Reg, PortCounter, ErrBit, Ctrl, Status, ID_VALUE
from .core import Nic, HostSignature, HOST_READ_LATENCY
from .buffer import BankedBuffer

__all__ = ["NicParams", "Reg", "PortCounter", "ErrBit", "Ctrl", "Status", "ID_VALUE",
           "Nic", "HostSignature", "HOST_READ_LATENCY", "BankedBuffer"]
