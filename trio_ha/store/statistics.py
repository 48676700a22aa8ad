"""StoreStatistics: what a store reports of itself at one moment (``MessageStore.statistics``).

One frozen value gathers the log's offsets and counters, the dispatcher's progress, the
recovery report, disk health, and the replication and sync-wait figures of the services the
store runs; the broker's metrics and runtime info read it (``broker.metrics``).
"""

from __future__ import annotations

import attrs

from .ha.master import HAMasterStatistics
from .ha.slave import HASlaveStatistics
from .health import StoreHealth
from .recovery import RecoveryReport
from .sync_requests import SyncServiceStatistics


@attrs.frozen
class StoreStatistics:
    backend: str
    min_commitlog_offset: int
    max_commitlog_offset: int
    flushed_offset: int
    flushes: int
    dispatched_offset: int
    dispatch_behind_bytes: int
    consume_queues: int
    segments: int
    puts: int
    put_failures: int
    dispatch_error: str | None
    recovery: RecoveryReport | None
    #: records a read refused to serve because they failed their check (checkCRCOnRead)
    unverified_reads: int = 0
    #: disk use, and what keeps the store from taking puts (a full disk, a segment or a
    #: consume-queue file that cannot be created)
    health: StoreHealth | None = None
    #: replication as the master sees it, when it listens for slaves
    ha: HAMasterStatistics | None = None
    #: replication as the slave sees it, on a slave
    ha_slave: HASlaveStatistics | None = None
    #: SYNC_FLUSH puts waiting for the disk (pending requests, the oldest wait)
    group_commit: SyncServiceStatistics | None = None
    #: SYNC_MASTER puts waiting for slaves
    group_transfer: SyncServiceStatistics | None = None
