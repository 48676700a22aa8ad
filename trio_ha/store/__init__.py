"""The storage layer: commitlog segments, consume queues, dispatch, recovery, flush."""

from .consume_queue import QueueEntry
from .results import GetMessageResult, GetMessageStatus, PutMessageResult, PutMessageStatus
from .store import MessageStore, StoreLock, StoreLockedError, StoreStatistics, open_store
from .sync_requests import PendingPut

__all__ = [
    "GetMessageResult", "GetMessageStatus", "MessageStore", "PendingPut", "PutMessageResult",
    "PutMessageStatus", "QueueEntry", "StoreLock", "StoreLockedError", "StoreStatistics",
    "open_store",
]
