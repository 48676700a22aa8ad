"""trio_ha: a replicated, RocketMQ-compatible message store on Trio.

The public API lives here; submodules are implementation detail unless documented. Names are
imported on first use, so code that needs only the codecs or the record engine — the Spark
data source, running inside executors — loads them without trio.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Loaded at once (it needs no trio): which record engine this process runs is decided, and
# with TRIO_HA_REQUIRE_NATIVE=1 a missing or stale native module fails the import.
from ._backend import NativeModuleError, native_backend

__version__ = "0.1.0"

_EXPORTS = {
    "BrokerRole": "trio_ha.config",
    "ConfigError": "trio_ha.config",
    "FlushDiskType": "trio_ha.config",
    "StoreConfig": "trio_ha.config",
    "GetMessageResult": "trio_ha.store",
    "GetMessageStatus": "trio_ha.store",
    "MessageStore": "trio_ha.store",
    "PutMessageResult": "trio_ha.store",
    "PutMessageStatus": "trio_ha.store",
    "StoreLockedError": "trio_ha.store",
    "StoreStatistics": "trio_ha.store",
    "open_store": "trio_ha.store",
    "Watermark": "trio_ha.watermark",
    "Message": "trio_ha.wire.record",
    "StoredMessage": "trio_ha.wire.record",
    "BrokerConfig": "trio_ha.broker",
    "serve_broker": "trio_ha.broker",
    "NamesrvConfig": "trio_ha.namesrv",
    "serve_namesrv": "trio_ha.namesrv",
    "open_producer": "trio_ha.client",
    "open_pull_consumer": "trio_ha.client",
    "open_admin": "trio_ha.client",
    "open_push_consumer": "trio_ha.client",
    "MQBrokerError": "trio_ha.client",
    "MQClientError": "trio_ha.client",
    "MQError": "trio_ha.client",
    "SendStatus": "trio_ha.client",
    "TransactionState": "trio_ha.client",
    "TrioHAError": "trio_ha._errors",
}

if TYPE_CHECKING:  # what the lazy names are, for a type checker (kept in step with _EXPORTS)
    from ._errors import TrioHAError
    from .broker import BrokerConfig, serve_broker
    from .client import (
        MQBrokerError,
        MQClientError,
        MQError,
        SendStatus,
        TransactionState,
        open_admin,
        open_producer,
        open_pull_consumer,
        open_push_consumer,
    )
    from .config import BrokerRole, ConfigError, FlushDiskType, StoreConfig
    from .namesrv import NamesrvConfig, serve_namesrv
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

__all__ = [
    "BrokerConfig", "BrokerRole", "ConfigError", "FlushDiskType", "GetMessageResult",
    "GetMessageStatus", "MQBrokerError", "MQClientError", "MQError", "Message", "MessageStore",
    "NamesrvConfig", "NativeModuleError", "PutMessageResult", "PutMessageStatus", "SendStatus",
    "StoreConfig", "StoreLockedError", "StoreStatistics", "StoredMessage", "TransactionState",
    "TrioHAError", "Watermark", "native_backend", "open_admin", "open_producer",
    "open_pull_consumer", "open_push_consumer", "open_store", "serve_broker", "serve_namesrv",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'trio_ha' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    # the public names only: not this module's own helpers (importlib, Any, annotations)
    return sorted([*__all__, "__version__"])
