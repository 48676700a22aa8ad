"""trio_ha: a replicated, RocketMQ-compatible message store on Trio.

The public API lives here; submodules are implementation detail unless documented.
"""

from ._backend import NativeModuleError, native_backend
from .config import BrokerRole, ConfigError, FlushDiskType, StoreConfig
from .store import (
    GetMessageResult,
    GetMessageStatus,
    MessageStore,
    PutMessageResult,
    PutMessageStatus,
    StoreLockedError,
    StoreStatistics,
    open_store,
)
from .watermark import Watermark
from .wire.record import Message, StoredMessage

__version__ = "0.1.0"

__all__ = [
    "BrokerRole", "ConfigError", "FlushDiskType", "GetMessageResult", "GetMessageStatus",
    "Message", "MessageStore", "NativeModuleError", "PutMessageResult", "PutMessageStatus",
    "StoreConfig", "StoreLockedError", "StoreStatistics", "StoredMessage", "Watermark",
    "native_backend", "open_store",
]
