"""Offline tools for a store directory that no broker has open: verify, inspect, truncate.

Why they exist: an operator facing a store that will not start cleanly, a slave that
diverged from its master, or a disk suspected of flipping bits needs to know what is on disk
and what the next start will do with it — *before* starting it, because a start acts:
recovery cuts the log, fills damaged ranges, rebuilds consume queues and deletes index files.

So these tools read the files the way the store reads them at open, and say what its recovery
would do by asking recovery's own rules instead of restating them. They borrow only public
names of the store's modules, never their private helpers: a private helper may change
without notice, a public name is a promise.

One module per tool, over what they share:

- ``verify``: every record, consume-queue entry and index file checked, the first bad byte of
  each area named with what recovery would do about it; read-only.
- ``inspect``: what the directory holds, as the store would report it; read-only, and without
  the lock, so it also reads a store a broker has open.
- ``truncate``: the explicit repair of a diverged slave, cut back to a record boundary with the
  store's own code, under the store's lock.
- ``_directory``: the store's files found, mapped read-only and locked as the store would.
"""

from ._directory import CheckpointSummary, OfflineStoreError
from .inspect import IndexFileSummary, QueueSummary, SegmentSummary, StoreInventory, inspect_store
from .truncate import IndexCut, QueueCut, TruncateOutcome, TruncatePlan, truncate_store
from .verify import Damage, Progress, VerifyReport, verify_store

__all__ = [
    "CheckpointSummary", "Damage", "IndexCut", "IndexFileSummary", "OfflineStoreError",
    "Progress", "QueueCut", "QueueSummary", "SegmentSummary", "StoreInventory",
    "TruncateOutcome", "TruncatePlan", "VerifyReport", "inspect_store", "truncate_store",
    "verify_store",
]
