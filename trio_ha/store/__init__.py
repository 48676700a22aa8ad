"""The storage layer: commitlog segments, consume queues, dispatch, recovery, flush.

This is the store's public face: what the broker and everything above it use of the store
is named here (an import-linter contract keeps them out of ``store.ha`` and
``store.sync_requests``): opening a store, a put as a value and its results, the statistics
and states the metrics report, the HA client a broker registers with its master's address,
the role scope a broker runs its own role's services in, the in-sync set a controller-mode
master's link proposes changes to,
and the splice pipe the loopback benchmark measures.
"""

from .consume_queue import QueueEntry
from .ha.epochs import EpochCache, EpochEntry, EpochFile, EpochFileError
from .ha.master import HAConnectionState, HAMasterStatistics, SlaveConnectionStatistics
from .ha.slave import HAClient, HAClientState, HASlaveStatistics
from .ha.sync_state import SyncState
from .ha.transfer import open_splice_pipe
from .opening import open_store
from .put_request import PutRequest
from .results import GetMessageResult, GetMessageStatus, PutMessageResult, PutMessageStatus
from .roles import RoleChangeError, RoleScope
from .statistics import StoreStatistics
from .store import MessageStore, StoreLock, StoreLockedError
from .sync_requests import PendingPut, SyncServiceStatistics
from .truncation import TruncationError, TruncationUnfinished

__all__ = [
    "EpochCache", "EpochEntry", "EpochFile", "EpochFileError",
    "GetMessageResult", "GetMessageStatus", "HAClient", "HAClientState", "HAConnectionState",
    "HAMasterStatistics", "HASlaveStatistics", "MessageStore", "PendingPut", "PutMessageResult",
    "PutMessageStatus", "PutRequest", "QueueEntry", "RoleChangeError", "RoleScope",
    "SlaveConnectionStatistics", "StoreLock", "StoreLockedError", "SyncState", "StoreStatistics",
    "SyncServiceStatistics", "TruncationError", "TruncationUnfinished", "open_splice_pipe",
    "open_store",
]
