"""StoreStatistics: what a store reports of itself at one moment (``MessageStore.statistics``).

One frozen value gathers the log's offsets and counters, the dispatcher's progress, the
recovery report, disk health, and the replication and sync-wait figures of the services the
store runs; the broker's metrics and runtime info read it (``broker.metrics``).
``store_statistics`` and ``store_health`` gather them; ``MessageStore`` binds them as its
``statistics`` and ``health`` methods, and they see the store through ``ReportingStore``,
so this module does not import the store that holds it.
"""

from __future__ import annotations

from typing import Protocol

import attrs

import trio_ha._backend as _backend

from .admission import Admission
from .commitlog import CommitLog
from .consume_queue import ConsumeQueueTable
from .dispatch import Dispatcher
from .group_commit import GroupCommitService
from .ha.group_transfer import GroupTransferService
from .ha.master import HAMasterStatistics, HAService
from .ha.slave import HAClient, HASlaveStatistics
from .health import DiskMonitor, StoreHealth
from .recovery import RecoveryReport
from .sync_requests import SyncServiceStatistics
from .verify import RecordVerifier


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


class ReportingStore(Protocol):
    """What the statistics read of the MessageStore."""

    @property
    def commitlog(self) -> CommitLog: ...

    @property
    def queues(self) -> ConsumeQueueTable: ...

    @property
    def dispatcher(self) -> Dispatcher: ...

    @property
    def recovery(self) -> RecoveryReport | None: ...

    @property
    def disk(self) -> DiskMonitor: ...

    @property
    def admission(self) -> Admission: ...

    @property
    def verifier(self) -> RecordVerifier | None: ...

    @property
    def ha_service(self) -> HAService | None: ...

    @property
    def ha_client(self) -> HAClient | None: ...

    @property
    def group_commit(self) -> GroupCommitService | None: ...

    @property
    def group_transfer(self) -> GroupTransferService | None: ...


def store_health(store: ReportingStore) -> StoreHealth:
    """Disk use, and what keeps the store from taking puts now."""
    commitlog, dispatcher = store.commitlog, store.dispatcher
    return StoreHealth(
        disk=store.disk.usage, disk_full=store.disk.full,
        allocation_error=commitlog.allocation_error,
        allocation_failures=commitlog.allocation_failures,
        dispatch_stalled=dispatcher.stalled, dispatch_stalls=dispatcher.stalls,
    )


def store_statistics(store: ReportingStore) -> StoreStatistics:
    """What ``store`` reports of itself now."""
    commitlog, dispatcher = store.commitlog, store.dispatcher
    ha_service, ha_client = store.ha_service, store.ha_client
    group_commit, group_transfer = store.group_commit, store.group_transfer
    return StoreStatistics(
        backend=_backend.native_backend,
        min_commitlog_offset=commitlog.min_offset,
        max_commitlog_offset=commitlog.max_offset,
        flushed_offset=commitlog.flushed.value,
        flushes=commitlog.flush_count,
        dispatched_offset=dispatcher.cursor,
        dispatch_behind_bytes=dispatcher.behind_bytes,
        consume_queues=len(store.queues.queues),
        segments=len(commitlog.segments.segments),
        puts=store.admission.puts,
        put_failures=store.admission.put_failures,
        dispatch_error=dispatcher.error,
        recovery=store.recovery,
        unverified_reads=store.verifier.failures if store.verifier is not None else 0,
        health=store_health(store),
        ha=ha_service.statistics() if ha_service is not None else None,
        ha_slave=ha_client.statistics() if ha_client is not None else None,
        group_commit=group_commit.statistics() if group_commit is not None else None,
        group_transfer=group_transfer.statistics() if group_transfer is not None else None,
    )
