"""Host driver: one API (:func:`open_nic` / :class:`Communicator`) over the backends
``model`` (golden executor), ``torch`` (Schedule IR over torch.distributed P2P) and ``rtl``
(fabric server over the host protocol). See :mod:`treenic.driver.core`,
:mod:`treenic.driver.protocol` (host protocol spec) and :mod:`treenic.driver.server`."""
from .core import BACKENDS, Communicator, Counters, SparseOutcome, open_nic, schedule_image
from .errors import (BadTensor, DriverError, FabricDisconnected, FabricError, FabricTimeout,
                     RTLFabricUnavailable)
from .fabric import LocalFabric, rtl_unavailable_reason

__all__ = ["BACKENDS", "Communicator", "Counters", "SparseOutcome", "open_nic",
           "schedule_image", "BadTensor", "DriverError", "FabricDisconnected", "FabricError",
           "FabricTimeout", "RTLFabricUnavailable", "LocalFabric", "rtl_unavailable_reason"]
