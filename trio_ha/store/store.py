"""MessageStore: the commitlog, its consume queues and the services that keep them, as one
async context manager.

``open_store(config)`` locks the directory, recovers it (see ``recovery``), brings the consume
queues up to date, and runs the store's services as tasks in its own nursery: segment
pre-allocation, commitlog flush (async flush, or group commit under SYNC_FLUSH), dispatch,
consume-queue flush with the checkpoint, retention, and replication (the HA service a master
listens with, the group transfer its SYNC_MASTER puts wait on, a slave's HA client). Leaving
the block stops taking puts, flushes everything, answers every put still waiting, writes the
checkpoint and removes the ``abort`` file — unless something was left undone, in which case
the next open performs crash recovery, as it would after a kill.

A put appends (``CommitLog.append``) and, when the store promises more than "in the page
cache", waits for its answers from group commit and group transfer (``sync_requests``).

This module is long because it is the store's one public face, as RocketMQ's
DefaultMessageStore is: opening and closing, puts, reads and statistics all go through the
object that owns the files and runs the services. What has logic of its own lives in its own
module (``commitlog``, ``consume_queue``, ``dispatch``, ``recovery``, ``retention``, ``lock``,
``group_commit``, ``ha``); what stays here is how they are put together and what a caller sees.

Everything here runs on one trio event loop; blocking work (file creation, msync/fdatasync,
recovery scans) is handed to worker threads.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Callable, Sequence

import attrs
import trio

from .. import _backend
from .._errors import unwrap_single_exception
from .._sockets import listen_named
from ..config import BrokerRole, FlushDiskType, StoreConfig
from ..ratelog import RateLimitedLog
from ..watermark import Watermark
from ..wire import layout
from ..wire import record as rec
from ..wire.errors import RecordDecodeError
from . import retention
from .checkpoint import Checkpoint
from .commitlog import CommitLog, SegmentUnavailable, encode_batch, encode_message
from .consume_queue import ConsumeQueueTable, QueueEntry, is_valid_topic
from .dispatch import Dispatcher
from .group_commit import GroupCommitService
from .ha.group_transfer import GroupTransferService
from .ha.master import HAMasterStatistics, HAService
from .ha.slave import HAClient, HASlaveStatistics
from .health import DiskMonitor, StoreHealth, StoreResourceError, describe
from .index import IndexService
from .lock import StoreLock, StoreLockedError
from .recovery import RecoveryReport, rebuild_disagreeing_queues, recover
from .results import (
    GetMessageResult,
    GetMessageStatus,
    PutMessageResult,
    PutMessageStatus,
    QueryMessageResult,
)
from .segment import Segment, sync_ranges
from .sync_requests import PendingPut, SyncServiceStatistics
from .verify import RecordVerifier

log = logging.getLogger(__name__)

# The record encoder reserves 64 KiB beyond the body limit for the rest of the record.
RECORD_OVERHEAD_LIMIT = 64 * 1024

#: read_queue without max_bytes
_NO_BYTE_LIMIT = 2**63 - 1
#: a read's status from the last entry a gather could not serve
_GATHER_STATUS = {
    _backend.GATHER_REMOVED: GetMessageStatus.MESSAGE_WAS_REMOVING,
    _backend.GATHER_ABSENT: GetMessageStatus.OFFSET_FOUND_NULL,
    _backend.GATHER_INVALID: GetMessageStatus.OFFSET_FOUND_NULL,
}
#: enough of a record's head to reach STORETIMESTAMP, whichever host kinds SYSFLAG chooses
_STORE_TIMESTAMP_HEAD = layout.store_timestamp_at(layout.SYSFLAG_BORNHOST_V6) + 8

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


@attrs.define(eq=False)
class MessageStore:
    config: StoreConfig
    commitlog: CommitLog
    queues: ConsumeQueueTable
    dispatcher: Dispatcher
    checkpoint: Checkpoint
    recovery: RecoveryReport | None = None
    _root: str = attrs.field(default="", alias="root")
    _running: bool = False
    _closed: bool = False
    #: running, open, and a master: the put fast path's one check
    _accepting: bool = False
    _puts: int = 0
    _put_failures: int = 0
    _born_hosts: dict[str, bytes] = attrs.field(factory=dict)
    _topics: dict[str, bytes] = attrs.field(factory=dict)
    #: the HA listener (when ha_listen_port is set) and, on a slave, the HA client: the
    #: store owns its replication, as RocketMQ's DefaultMessageStore owns HAService
    ha_service: HAService | None = None
    ha_client: HAClient | None = None
    #: the services SYNC_FLUSH and SYNC_MASTER puts wait on
    group_commit: GroupCommitService | None = None
    group_transfer: GroupTransferService | None = None
    #: the index files (messageIndexEnable), opened by recovery
    index: IndexService | None = None
    #: whether a put has anything to wait for after its append (read on every put)
    _waits: bool = attrs.field(default=False, alias="waits")
    #: checks records before they are served (None: checkCRCOnRead is off)
    _verifier: RecordVerifier | None = attrs.field(default=None, alias="verifier")
    #: decides consume-queue entries against the commitlog for reads (read_queue)
    _gatherer: _backend.Gatherer = attrs.field(init=False,
                                               factory=lambda: _backend.engine.gatherer())
    #: why puts are refused for disk use (None: they are not), and the use at the last look
    #: refuses puts above diskSpaceWarningLevelRatio (set up by the constructor)
    disk: DiskMonitor = attrs.field(init=False)
    _health_log: RateLimitedLog = attrs.field(factory=lambda: RateLimitedLog(log))

    def __attrs_post_init__(self) -> None:
        self.disk = DiskMonitor(
            (self.config.commitlog_dir, self.queues.root),
            self.config.disk_space_warning_level_ratio,
        )

    # ---- opening -------------------------------------------------------------------------

    @classmethod
    def _open_blocking(cls, config: StoreConfig, root: str) -> MessageStore:
        """Load and recover the store at ``root``, whose lock the caller holds."""
        commitlog = CommitLog.load(config)
        try:
            queues = ConsumeQueueTable.load(
                os.path.join(root, "consumequeue"), config.mapped_file_size_consume_queue
            )
        except BaseException:
            commitlog.close()
            raise
        ha_service = HAService(config, commitlog) if config.ha_listen_port is not None else None
        store = cls(
            config, commitlog, queues,
            Dispatcher(commitlog, queues, max_record_size=max_record_size(config),
                       delay_levels=config.delay_levels),
            Checkpoint.load(os.path.join(root, "checkpoint")),
            root=root,
            ha_service=ha_service,
            ha_client=(
                HAClient(config, commitlog, config.ha_master_address)
                if config.broker_role is BrokerRole.SLAVE else None
            ),
            group_commit=(
                GroupCommitService.for_commitlog(commitlog, config)
                if config.flush_disk_type is FlushDiskType.SYNC_FLUSH else None
            ),
            group_transfer=(
                ha_service.group_transfer_service()
                if config.broker_role is BrokerRole.SYNC_MASTER and ha_service is not None
                else None
            ),
            waits=(
                config.flush_disk_type is FlushDiskType.SYNC_FLUSH
                or config.broker_role is BrokerRole.SYNC_MASTER
            ),
            verifier=(
                RecordVerifier(max_record_size(config)) if config.check_crc_on_read
                else None
            ),
        )
        try:
            store._recover()
            # Present while the store is open: found at the next open, it means a crash.
            with open(store._abort_path, "wb"):
                pass
        except BaseException:
            store._close_files()
            raise
        return store

    def _recover(self) -> None:
        abnormal = os.path.exists(self._abort_path)
        self.recovery = recover(
            self.commitlog, self.queues, self.dispatcher, self.checkpoint,
            abnormal=abnormal, check_crc=self.config.check_crc_on_recover,
            max_record=max_record_size(self.config),
            skip_holes=self.config.skip_corrupt_records_on_recover,
            quarantine_dir=os.path.join(self._root, "corrupt"),
        )
        log.info("store %s recovered %s", self._root, self.recovery.describe())
        if self.config.message_index_enable:
            self.index = IndexService.load(
                self._root, self.config, abnormal=abnormal,
                checkpoint_timestamp=self.checkpoint.index_msg_timestamp,
            )
            # The index picks up where its files end, up to the recovered end of the log
            # (files naming records past it are stale). Not the dispatcher's cursor: after a
            # clean stop recovery sets it back to the last segment's start to re-dispatch
            # it, often 0, and every index file then looked stale and was rebuilt.
            self.index.catch_up(self.commitlog, self.commitlog.max_offset,
                                max_record_size(self.config))
            self.dispatcher.indexer = self.index
        if not self.commitlog.segments.segments and self.config.broker_role is not BrokerRole.SLAVE:
            # A slave's log starts wherever its master starts it (HA creates that segment).
            first = self.commitlog.create_first_segment(0)
            self.commitlog.segments.append_segment(first)
        # Bring the consume queues up to the recovered end before taking puts (RocketMQ's
        # start() blocks until reput has caught up), then derive the next queue offsets.
        while self.dispatcher.dispatch_available(self.commitlog.max_offset):
            pass
        if self.dispatcher.stalled is not None:
            # The next queue offsets come from the consume queues: they must be whole first.
            raise StoreResourceError(
                f"store {self._root}: cannot bring the consume queues up to the commitlog: "
                f"{self.dispatcher.stalled}"
            )
        rebuilt = rebuild_disagreeing_queues(self.commitlog, self.queues, self.dispatcher)
        if rebuilt:
            self.recovery = attrs.evolve(self.recovery, rebuilt_queues=rebuilt)
        self.commitlog.queue_offsets = {
            (queue.topic, queue.queue_id): queue.max_offset for queue in self.queues
        }

    @property
    def _abort_path(self) -> str:
        return os.path.join(self._root, "abort")

    @property
    def root(self) -> str:
        return self._root

    # ---- services -----------------------------------------------------------------------------

    @property
    def confirmed(self) -> Watermark:
        """What consumers may see: flushed bytes under SYNC_FLUSH, written ones otherwise."""
        if self.config.flush_disk_type is FlushDiskType.SYNC_FLUSH:
            return self.commitlog.flushed
        return self.commitlog.written

    async def _run_services(self, nursery: trio.Nursery,
                            ha_listeners: list[trio.SocketListener]) -> None:
        commitlog = self.commitlog
        await nursery.start(commitlog.run_allocator)
        if self.group_commit is not None:
            await nursery.start(self.group_commit.run)  # SYNC_FLUSH: it flushes, too
        else:
            await nursery.start(commitlog.run_async_flush)
        await nursery.start(self.dispatcher.run, self.confirmed)
        await nursery.start(self._run_queue_flush)
        await nursery.start(retention.run_retention, self)
        await nursery.start(self.disk.run)
        if self.ha_service is not None:
            await nursery.start(functools.partial(self.ha_service.serve,
                                                  listeners=ha_listeners))
        if self.group_transfer is not None:
            await nursery.start(self.group_transfer.run)
        if self.ha_client is not None:
            await nursery.start(self.ha_client.run)

    async def _run_queue_flush(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Flush consume queues every flushIntervalConsumeQueue (2 dirty pages at least, all
        of them every flushConsumeQueueThoroughInterval), then the checkpoint."""
        config = self.config
        task_status.started()
        last_thorough = trio.current_time()
        while True:
            await trio.sleep(config.flush_interval_consume_queue / 1000)
            least = config.flush_consume_queue_least_pages
            now = trio.current_time()
            if now - last_thorough >= config.flush_consume_queue_thorough_interval / 1000:
                least, last_thorough = 0, now
            await self.flush_consume_queues(least)

    def check_disk(self) -> None:
        """Look at the disk use now (the store's task does it every second)."""
        self.disk.check()

    def health(self) -> StoreHealth:
        commitlog, dispatcher = self.commitlog, self.dispatcher
        return StoreHealth(
            disk=self.disk.usage, disk_full=self.disk.full,
            allocation_error=commitlog.allocation_error,
            allocation_failures=commitlog.allocation_failures,
            dispatch_stalled=dispatcher.stalled, dispatch_stalls=dispatcher.stalls,
        )

    async def flush_consume_queues(self, least_pages: int = 0) -> None:
        """Sync dirty consume-queue pages, then record in the checkpoint only what is now
        durable on both sides: the flushed commitlog's and the flushed queues' timestamps."""
        logics_timestamp = self.dispatcher.last_store_timestamp
        work = [item for queue in self.queues for item in queue.dirty_segments(least_pages)]
        with contextlib.ExitStack() as holds:
            for segment, _, _ in work:
                holds.enter_context(segment.hold())
            if work:
                await trio.to_thread.run_sync(sync_ranges, work, abandon_on_cancel=False)
        for segment, _, end in work:
            segment.flushed_position = max(segment.flushed_position, end)
        # A queue with fewer than least_pages dirty pages was skipped (and entries may have
        # arrived during the sync): the checkpoint must stay below the oldest record whose
        # entry is not on disk, or a crash recovery starting after it would never re-index
        # that entry (RocketMQ moves logicsMsgTimestamp only in thorough rounds for this).
        for queue in self.queues:
            if queue.unflushed_since:
                if queue.dirty_segments(0):
                    logics_timestamp = min(logics_timestamp, queue.unflushed_since - 1)
                else:
                    queue.unflushed_since = 0
        checkpoint = self.checkpoint
        changed = False
        if least_pages == 0 and self.index is not None:
            # A thorough round: the index files' writes reach the disk, then the checkpoint
            # says up to when (crash recovery keeps the files that end by then).
            try:
                synced = await trio.to_thread.run_sync(self.index.sync, abandon_on_cancel=False)
            except OSError as exc:
                synced = 0
                self._health_log.log(logging.ERROR, "index", "store %s: cannot sync the index "
                                     "files: %s", self._root, describe(exc))
            if synced > checkpoint.index_msg_timestamp:
                checkpoint.index_msg_timestamp = synced
                changed = True
        if logics_timestamp > checkpoint.logics_msg_timestamp:
            checkpoint.logics_msg_timestamp = logics_timestamp
            changed = True
        physic = self.commitlog.flushed_store_timestamp
        if physic > checkpoint.physic_msg_timestamp:
            checkpoint.physic_msg_timestamp = physic
            changed = True
        if changed:
            try:
                await trio.to_thread.run_sync(checkpoint.write, abandon_on_cancel=False)
            except OSError as exc:
                # No descriptor or no room for it: the file keeps its older values, which
                # only make a crash recovery start earlier. Try again next round.
                self._health_log.log(logging.ERROR, "checkpoint",
                                     "store %s: cannot write the checkpoint: %s", self._root,
                                     describe(exc))

    async def _shutdown(self) -> None:
        """Stop taking puts, make everything durable, and say so with the abort file."""
        self._closed = True
        self._accepting = False
        await self.commitlog.flush(0)
        while self.dispatcher.dispatch_available(self.confirmed.value):
            await trio.lowlevel.checkpoint()
        await self.flush_consume_queues(0)
        clean = self.dispatcher.error is None and self.dispatcher.behind_bytes == 0
        if clean:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._abort_path)
        else:
            log.warning(
                "store %s closed with work left (dispatch behind %d bytes, error %s); "
                "the next open will run crash recovery",
                self._root, self.dispatcher.behind_bytes, self.dispatcher.error,
            )

    def _close_files(self) -> None:
        self.commitlog.close()
        self.queues.close()
        if self.index is not None:
            self.index.close()

    # ---- puts -------------------------------------------------------------------------------

    def _admit(self, topic: str, queue_id: int, body_len: int) -> bytes | PutMessageResult:
        """The encoded topic of a put that may go ahead, or why it is refused before it
        touches the log. (The put paths first try ``_accepts``, a cached fast check; this is
        the full one, with the reasons.)"""
        if self._closed or not self._running:
            return self._illegal("store is closed", PutMessageStatus.SERVICE_NOT_AVAILABLE)
        if self.config.broker_role is BrokerRole.SLAVE:
            return self._illegal(
                "a slave does not accept writes", PutMessageStatus.SERVICE_NOT_AVAILABLE
            )
        if self.dispatcher.error is not None:
            return self._illegal(
                f"store is read-only: {self.dispatcher.error}",
                PutMessageStatus.SERVICE_NOT_AVAILABLE,
            )
        if self.disk.full is not None:
            return self._illegal(self.disk.full, PutMessageStatus.SERVICE_NOT_AVAILABLE)
        if self.dispatcher.stalled is not None:
            return self._illegal(
                f"the consume queues cannot be written now ({self.dispatcher.stalled}); "
                "the store takes puts again once they can",
                PutMessageStatus.SERVICE_NOT_AVAILABLE,
            )
        topic_bytes = self._topic_bytes(topic)
        if topic_bytes is None:
            return self._illegal(
                f"topic {topic!r} is not a valid topic name (1-127 of [%|a-zA-Z0-9_-])"
            )
        if not 0 <= queue_id <= layout.INT32_MAX:
            return self._illegal(f"queue id {queue_id} out of range")
        if body_len > self.config.max_message_size:
            return self._illegal(
                f"body of {body_len} bytes exceeds maxMessageSize {self.config.max_message_size}"
            )
        return topic_bytes

    def _accepts(self, topic: str, queue_id: int, body_len: int) -> bytes | None:
        """The fast path of ``_admit``: the encoded topic when nothing stands in the way."""
        dispatcher = self.dispatcher
        if (
            self._accepting
            and dispatcher.error is None
            and dispatcher.stalled is None
            and self.disk.full is None
            and 0 <= queue_id <= layout.INT32_MAX
            and body_len <= self.config.max_message_size
        ):
            return self._topics.get(topic)
        return None

    def _born_host(self, born_host: str | None) -> bytes:
        if born_host is None:
            return self.commitlog.store_host
        encoded = self._born_hosts.get(born_host)
        if encoded is None:
            encoded = rec.encode_host(*rec.parse_host_port(born_host))
            if len(self._born_hosts) < 4096:
                self._born_hosts[born_host] = encoded
        return encoded

    def _illegal(self, remark: str, status=PutMessageStatus.MESSAGE_ILLEGAL) -> PutMessageResult:
        self._put_failures += 1
        return PutMessageResult(status, remark=remark)

    def _topic_bytes(self, topic: str) -> bytes | None:
        """The encoded topic, or None if it is not a valid topic name (cached: a store sees
        few distinct topics, and this runs on every put)."""
        encoded = self._topics.get(topic)
        if encoded is None and is_valid_topic(topic):
            encoded = topic.encode()
            if len(self._topics) < 65536:
                self._topics[topic] = encoded
        return encoded

    async def put_message(self, message: rec.Message, queue_id: int = 0) -> PutMessageResult:
        """Append one message; the result says whether it is stored, and how durably."""
        return await self.put_encoded(
            message.topic, queue_id, message.body, message.encoded_properties(),
            flag=message.flag, sys_flag=message.sys_flag,
            born_timestamp=message.born_timestamp, born_host=message.born_host,
            reconsume_times=message.reconsume_times,
            prepared_transaction_offset=message.prepared_transaction_offset,
            wait_store_msg_ok=message.properties.get(rec.PROPERTY_WAIT_STORE_MSG_OK) != "false",
        )

    async def put_encoded(
        self,
        topic: str,
        queue_id: int,
        body: bytes,
        properties: bytes,
        *,
        flag: int = 0,
        sys_flag: int = 0,
        born_timestamp: int | None = None,
        born_host: str | None = None,
        reconsume_times: int = 0,
        prepared_transaction_offset: int = 0,
        wait_store_msg_ok: bool = True,
    ) -> PutMessageResult:
        """Append one message whose PROPERTIES field is already encoded (the broker's path:
        it forwards what the producer sent).

        Cancellation is looked at first, before anything is written: a cancelled put has not
        happened, and a put that happened is never turned into a Cancelled exception (except
        while it waits for SYNC_FLUSH or slaves, where the caller chose to stop waiting). The
        put yields once, after its append (``_finish``): a SYNC_MASTER put appends in the
        round its request is read and its bytes go to the slave in the next (issue 11)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        return await self._finish(await self._appended(functools.partial(
            self._append_encoded_now, topic, queue_id, body, properties, flag, sys_flag,
            born_timestamp, born_host, reconsume_times, prepared_transaction_offset,
        )), wait_store_msg_ok)

    def put_encoded_now(
        self,
        topic: str,
        queue_id: int,
        body: bytes,
        properties: bytes,
        *,
        flag: int = 0,
        sys_flag: int = 0,
        born_timestamp: int | None = None,
        born_host: str | None = None,
        reconsume_times: int = 0,
        wait_store_msg_ok: bool = True,
    ) -> PutMessageResult | PendingPut | None:
        """``put_encoded`` without a task switch, for a caller that cannot wait in place
        (the broker answers a send from the reader's round, issue 11): the result; or, for a
        put that must wait for SYNC_FLUSH or slaves, its ``PendingPut``; or None, with
        nothing of it appended, when the put would have to wait for a new segment first
        (then call ``put_encoded``; the full segment may have been closed already)."""
        appended = self._append_encoded_now(
            topic, queue_id, body, properties, flag, sys_flag, born_timestamp, born_host,
            reconsume_times, 0,
        )
        if appended is None or not self._will_wait(appended, wait_store_msg_ok):
            return appended
        return self._pending(appended)

    async def _appended(
        self, append_now: Callable[[], PutMessageResult | None]
    ) -> PutMessageResult:
        """What ``append_now()`` appended, after waiting for the next segment as often as it
        needs one (a put's only await before its append)."""
        while (appended := append_now()) is None:
            try:
                await self.commitlog.wait_for_segment()
            except SegmentUnavailable as exc:
                return self._illegal(str(exc), PutMessageStatus.CREATE_MAPEDFILE_FAILED)
        return appended

    def _append_encoded_now(
        self, topic: str, queue_id: int, body: bytes, properties: bytes, flag: int,
        sys_flag: int, born_timestamp: int | None, born_host: str | None, reconsume_times: int,
        prepared_transaction_offset: int,
    ) -> PutMessageResult | None:
        """The append of ``put_encoded``; None (nothing of it appended) when it must wait
        for the next segment (``_appended``)."""
        topic_bytes = self._accepts(topic, queue_id, len(body))
        if topic_bytes is None:
            admitted = self._admit(topic, queue_id, len(body))
            if isinstance(admitted, PutMessageResult):
                return admitted
            topic_bytes = admitted
        if len(properties) > rec.MAX_PROPERTIES_LENGTH:
            return self._illegal(
                f"properties of {len(properties)} bytes exceed {rec.MAX_PROPERTIES_LENGTH}",
                PutMessageStatus.PROPERTIES_SIZE_EXCEEDED,
            )
        if properties and properties[-1] == 0:  # (an index, not a slice: no copy per put)
            # A record never ends in a 0 byte: recovery takes one that does for a torn record.
            return self._illegal("the properties end in a NUL byte (a property value may not)")
        tx_type = sys_flag & layout.TRANSACTION_TYPE_MASK
        consumable = (
            tx_type != layout.TRANSACTION_PREPARED and tx_type != layout.TRANSACTION_ROLLBACK
        )
        item = (
            topic_bytes, body, properties, queue_id, flag, sys_flag, born_timestamp,
            self._born_host(born_host), reconsume_times, prepared_transaction_offset,
        )
        appended = self.commitlog.append_now(
            encode_message, item, (topic, queue_id) if consumable else None
        )
        if appended is None:
            return None
        if isinstance(appended, int):
            return self._illegal(
                _encode_error(appended, len(topic_bytes)), _encode_status(appended)
            )
        self._puts += 1
        return appended

    def _will_wait(self, result: PutMessageResult, wait: bool) -> bool:
        return wait and self._waits and result.status is PutMessageStatus.PUT_OK

    async def _finish(self, result: PutMessageResult, wait: bool) -> PutMessageResult:
        """The end of a put: wait for what the store promises (that wait is the put's
        yield), or yield once without a cancellation point (the put happened)."""
        if self._will_wait(result, wait):
            return await self._pending(result).wait()
        await trio.lowlevel.cancel_shielded_checkpoint()
        return result

    async def put_messages(
        self, messages: Sequence[rec.Message], queue_id: int = 0
    ) -> PutMessageResult:
        """Append a batch of messages of one topic to one queue, all or nothing, with
        consecutive queue and commitlog offsets (SEND_BATCH_MESSAGE semantics)."""
        messages = list(messages)
        topics = {m.topic for m in messages}
        if len(topics) != 1:
            await trio.lowlevel.checkpoint()
            return self._illegal("a batch needs at least one message, all of one topic")
        first = messages[0]
        if any(m.sys_flag & rec.TRANSACTION_TYPE_MASK for m in messages):
            await trio.lowlevel.checkpoint()
            return self._illegal("transaction messages cannot be batched")
        try:
            body = rec.encode_batch(messages)
        except ValueError as exc:
            await trio.lowlevel.checkpoint()
            return self._illegal(str(exc), PutMessageStatus.PROPERTIES_SIZE_EXCEEDED)
        wait = all(
            m.properties.get(rec.PROPERTY_WAIT_STORE_MSG_OK) != "false" for m in messages
        )
        return await self.put_batch(
            first.topic, queue_id, body, born_host=first.born_host,
            born_timestamp=first.born_timestamp, wait_store_msg_ok=wait,
        )

    async def put_batch(
        self,
        topic: str,
        queue_id: int,
        body: bytes,
        *,
        batch_properties: bytes = b"",
        sys_flag: int = 0,
        born_host: str | None = None,
        born_timestamp: int | None = None,
        wait_store_msg_ok: bool = True,
    ) -> PutMessageResult:
        """Append an already-encoded SEND_BATCH_MESSAGE body (the broker's path: no
        per-message Python work, the native encoder converts every item). Cancellation and
        the yield as in ``put_encoded``."""
        await trio.lowlevel.checkpoint_if_cancelled()
        return await self._finish(await self._appended(functools.partial(
            self._append_batch_now, topic, queue_id, body, batch_properties, sys_flag,
            born_host, born_timestamp,
        )), wait_store_msg_ok)

    def put_batch_now(
        self,
        topic: str,
        queue_id: int,
        body: bytes,
        *,
        batch_properties: bytes = b"",
        sys_flag: int = 0,
        born_host: str | None = None,
        born_timestamp: int | None = None,
        wait_store_msg_ok: bool = True,
    ) -> PutMessageResult | PendingPut | None:
        """``put_batch`` without a task switch, as ``put_encoded_now``."""
        appended = self._append_batch_now(
            topic, queue_id, body, batch_properties, sys_flag, born_host, born_timestamp,
        )
        if appended is None or not self._will_wait(appended, wait_store_msg_ok):
            return appended
        return self._pending(appended)

    def _append_batch_now(
        self, topic: str, queue_id: int, body: bytes, batch_properties: bytes, sys_flag: int,
        born_host: str | None, born_timestamp: int | None,
    ) -> PutMessageResult | None:
        """The append of ``put_batch``; None as in ``_append_encoded_now``."""
        topic_bytes = self._accepts(topic, queue_id, len(body))
        if topic_bytes is None:
            # The whole body counts against maxMessageSize, as RocketMQ checks a batch.
            admitted = self._admit(topic, queue_id, len(body))
            if isinstance(admitted, PutMessageResult):
                return admitted
            topic_bytes = admitted
        if sys_flag & layout.TRANSACTION_TYPE_MASK:
            return self._illegal("transaction messages cannot be batched")
        item = (
            body, topic_bytes, batch_properties, queue_id, sys_flag, born_timestamp,
            self._born_host(born_host), self.config.max_message_size,
        )
        appended = self.commitlog.append_now(encode_batch, item, (topic, queue_id))
        if appended is None:
            return None
        if isinstance(appended, int):
            return self._illegal(
                _encode_error(appended, len(topic_bytes)), _encode_status(appended)
            )
        self._puts += appended.count
        return appended

    def _pending(self, appended: PutMessageResult) -> PendingPut:
        """The waits of a put for what this store promises: SYNC_FLUSH, its bytes synced
        (syncFlushTimeout); SYNC_MASTER, enough slaves acked them (slaveTimeout). The put
        makes its requests to both services at once, so both clocks start now and the
        waits overlap (a slave keeps copying while the put waits for the disk)."""
        end = appended.commitlog_offset + appended.size
        start = trio.current_time()
        group_commit, group_transfer = self.group_commit, self.group_transfer
        return PendingPut(
            appended,
            durable=group_commit.request(end, start) if group_commit is not None else None,
            replica=group_transfer.request(end, start) if group_transfer is not None else None,
            # a SYNC_MASTER without an HA service: no slave can ack
            no_replicas=group_transfer is None
            and self.config.broker_role is BrokerRole.SYNC_MASTER,
        )

    # ---- reads --------------------------------------------------------------------------------

    @property
    def min_commitlog_offset(self) -> int:
        return self.commitlog.min_offset

    @property
    def max_commitlog_offset(self) -> int:
        """One past the last byte readers may see (the confirmed end of the log)."""
        return self.confirmed.value

    def max_queue_offset(self, topic: str, queue_id: int) -> int:
        queue = self.queues.get(topic, queue_id)
        return queue.max_offset if queue is not None else 0

    def min_queue_offset(self, topic: str, queue_id: int) -> int:
        queue = self.queues.get(topic, queue_id)
        return queue.min_offset if queue is not None else 0

    def topics(self) -> set[str]:
        return {topic for topic, _ in self.queues.queues}

    def _record_at(self, offset: int, size: int | None = None,
                   expect: tuple[bytes, int, int] | None = None) -> bytes | None:
        """The bytes of the record at ``offset``, if one that readers may see is there —
        checked first (``checkCRCOnRead``, see ``verify``). ``expect``: the (topic, queue
        id, queue offset) a consume-queue entry promised; a record that fails then is
        counted and logged as unverified, not only missing."""
        limit = self.confirmed.value
        segment = self.commitlog.segments.find(offset)
        if segment is None or offset + 8 > limit or offset < self.commitlog.min_offset:
            return None
        at = offset - segment.base_offset
        if size is None:
            size = int(layout.RECORD_START.unpack(segment.read(at, layout.RECORD_START.size))[0])
        if size <= 0 or offset + size > min(limit, segment.wrote_offset):
            return None
        record = segment.read(at, size)
        if self._verifier is not None:
            problem = self._verifier.problem(segment, at, record, expect)
            if problem is not None:
                if expect is not None:
                    self._verifier.refused(
                        offset, problem,
                        f"{expect[0].decode(errors='replace')}/{expect[1]} queue offset "
                        f"{expect[2]}",
                    )
                return None
        return record

    def _decode_at(self, offset: int, size: int | None = None) -> rec.StoredMessage | None:
        record = self._record_at(offset, size)
        if record is None:
            return None
        try:
            return rec.decode_record(record)
        except RecordDecodeError:
            return None

    def record_bytes(self, commitlog_offset: int) -> bytes | None:
        """The raw record at ``commitlog_offset`` if it is a whole, valid record (for
        VIEW_MESSAGE_BY_ID, whose response body is the record unchanged)."""
        record = self._record_at(commitlog_offset)
        if record is None:
            return None
        try:
            rec.decode_record(record)
        except RecordDecodeError:
            return None
        return record

    def queue_entries(
        self, topic: str, queue_id: int, queue_offset: int, max_count: int
    ) -> list[QueueEntry]:
        """Up to ``max_count`` consume-queue entries of (topic, queue) from ``queue_offset``
        (fewer at the end of a consume-queue file; none past the queue's end): where each
        message is in the commitlog, and its tags code (a delayed message's due time)."""
        queue = self.queues.get(topic, queue_id)
        if queue is None or queue_offset < queue.min_offset or queue_offset >= queue.max_offset:
            return []
        return queue.entries(queue_offset, min(max_count, queue.max_offset - queue_offset))

    def queue_arrivals(self, topic: str, queue_id: int) -> Watermark:
        """Rises with the queue's max offset: ``await queue_arrivals(t, q).wait_for(n + 1)``
        returns once message ``n`` is there (long polling)."""
        return self.queues.arrivals(topic, queue_id)

    def read_queue(
        self,
        topic: str,
        queue_id: int,
        queue_offset: int,
        max_count: int,
        *,
        max_bytes: int | None = None,
        tag_codes: frozenset[int] | None = None,
        raw: bool = False,
    ) -> GetMessageResult:
        """Messages of one queue from ``queue_offset`` with RocketMQ's GetMessageStatus and
        next offset. Synchronous: it reads only mapped memory.

        ``tag_codes`` keeps only entries whose tag hash is in the set (RocketMQ filters by
        hash here; the exact tag is checked by whoever reads the record). With ``raw`` the
        result holds each record's bytes unchanged (what a pull response carries) in
        ``records`` instead of decoded ``messages``, and in ``spans`` with adjacent records
        merged: views of the mapped segments, not copies (see GetMessageResult).

        Each record is checked before it is served (``verify``), in C, together with the
        consume-queue entry that points at it: one native call decides a run of entries."""
        queue = self.queues.get(topic, queue_id)
        if queue is None:
            return GetMessageResult(GetMessageStatus.NO_MATCHED_LOGIC_QUEUE)
        low, high = queue.min_offset, queue.max_offset
        if high == 0:
            return GetMessageResult(GetMessageStatus.NO_MESSAGE_IN_QUEUE, (), 0, low, high)
        if queue_offset < low:
            return GetMessageResult(GetMessageStatus.OFFSET_TOO_SMALL, (), low, low, high)
        if queue_offset == high:
            return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_ONE, (), high, low, high)
        if queue_offset > high:
            return GetMessageResult(
                GetMessageStatus.OFFSET_OVERFLOW_BADLY, (), low if low == 0 else high, low, high
            )
        verifier = self._verifier
        gatherer = self._gatherer
        flags = _backend.GATHER_VERIFY if verifier is not None else 0
        max_record = verifier.max_record if verifier is not None else layout.INT32_MAX
        codes = None if tag_codes is None else tuple(tag_codes)
        byte_limit = max_bytes if max_bytes is not None else _NO_BYTE_LIMIT
        limit = self.confirmed.value
        commitlog_min = self.commitlog.min_offset
        segments = self.commitlog.segments
        topic_bytes = topic.encode()
        found: list = []
        spans: list[tuple[Segment, int, int]] = []  # (segment, position, length)
        next_offset = queue_offset
        total = 0
        last_commitlog_offset = -1
        status = GetMessageStatus.NO_MATCHED_MESSAGE
        # RocketMQ scans at most max(16000 bytes, maxMsgNums * 20) of consume queue per pull.
        budget = max(800, max_count)
        while len(found) < max_count and next_offset < high and budget > 0:
            entries = queue.entry_bytes(next_offset, min(budget, max_count - len(found) + 64))
            if not entries:
                break
            # The segment of the first entry's record; the gather stops where the next one is.
            segment = segments.find(layout.INT64.unpack_from(entries)[0])
            if segment is None:
                segment = segments.segments[-1] if segments.segments else None
            if segment is None:
                break  # no commitlog at all: nothing a consume queue points at is readable
            result = gatherer.gather(
                segment.handle, segment.size, segment.base_offset, commitlog_min,
                min(limit, segment.wrote_offset), entries, codes, topic_bytes, queue_id,
                next_offset, flags, max_record, max_count - len(found), byte_limit, total,
            )
            looked = result.entries
            if looked == 0 and result.stop == _backend.GATHER_SEGMENT:
                # Its record is in no segment (past the log's end): missing.
                status = GetMessageStatus.OFFSET_FOUND_NULL
                looked = 1
            elif result.problems:
                status = _GATHER_STATUS[result.last_problem]
                if verifier is not None and _backend.GATHER_INVALID in result.outcomes:
                    self._report_unverified(verifier, segment, entries, result.outcomes,
                                            topic_bytes, queue_id, next_offset)
            if result.found:
                whole = segment.view()
                if raw:
                    found.extend(whole[at : at + size] for at, size in result.records)
                    gathered = result.spans
                    if spans and spans[-1][0] is segment and sum(spans[-1][1:]) == gathered[0][0]:
                        # the run goes on across a consume-queue file: one span still
                        spans[-1] = (segment, spans[-1][1], spans[-1][2] + gathered[0][1])
                        gathered = gathered[1:]
                    spans.extend((segment, at, size) for at, size in gathered)
                else:
                    for at, size in result.records:
                        try:
                            found.append(rec.decode_record(whole[at : at + size]))
                        except RecordDecodeError:
                            status = GetMessageStatus.OFFSET_FOUND_NULL
                total += result.bytes
                last_commitlog_offset = result.last_phys
            next_offset += looked
            budget -= looked
            if result.stop in (_backend.GATHER_COUNT, _backend.GATHER_BYTES):
                break
        if found:
            status = GetMessageStatus.FOUND
        if raw:
            views = tuple(segment.view(at, at + size) for segment, at, size in spans)
            return GetMessageResult(status, (), next_offset, low, high, tuple(found),
                                    last_commitlog_offset, views)
        return GetMessageResult(status, tuple(found), next_offset, low, high, (),
                                last_commitlog_offset)

    def _report_unverified(self, verifier: RecordVerifier, segment, entries: bytes,
                           outcomes: bytes, topic: bytes, queue_id: int,
                           first_queue_offset: int) -> None:
        """Count and log the records a gather refused, with why (the slow check says)."""
        for i, outcome in enumerate(outcomes):
            if outcome != _backend.GATHER_INVALID:
                continue
            offset, size, _ = layout.CQ_ENTRY.unpack_from(entries, i * layout.CQ_ENTRY_SIZE)
            at = offset - segment.base_offset
            problem = verifier.problem(segment, at, segment.read(at, size),
                                       (topic, queue_id, first_queue_offset + i))
            verifier.refused(
                offset, problem or "it changed while being read",
                f"{topic.decode(errors='replace')}/{queue_id} queue offset "
                f"{first_queue_offset + i}",
            )

    async def get_messages(
        self,
        topic: str,
        queue_id: int,
        queue_offset: int,
        max_count: int = 32,
        *,
        max_bytes: int | None = None,
    ) -> list[rec.StoredMessage]:
        """Up to ``max_count`` decoded messages of (topic, queue) from ``queue_offset``."""
        await trio.lowlevel.checkpoint()
        return list(
            self.read_queue(topic, queue_id, queue_offset, max_count, max_bytes=max_bytes).messages
        )

    def query_message(
        self, topic: str, key: str, max_num: int, begin: int, end: int
    ) -> QueryMessageResult:
        """The records of ``topic`` whose UNIQ_KEY or one of whose KEYS is ``key``, stored in
        [begin, end] (ms since the epoch), newest first, at most ``max_num`` (and
        maxMsgsNumBatch). The index may name records of other keys with the same hash and
        records since removed: only whole, valid records of this topic and key are
        returned (RocketMQ leaves that filter to the client)."""
        if self.index is None:
            return QueryMessageResult([], 0, 0)
        max_num = min(max_num, self.config.max_msgs_num_batch)
        found = self.index.query(topic, key, max_num, begin, end)
        records = []
        for offset in found.phy_offsets:
            record = self._record_at(offset)
            if record is None:
                continue
            try:
                message = rec.decode_record(record)
            except RecordDecodeError:
                continue
            if message.topic == topic and (
                key in message.keys
                or message.properties.get(rec.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX) == key
            ):
                records.append(record)
        return QueryMessageResult(records, found.index_last_update_timestamp,
                                  found.index_last_update_phy_offset)

    async def look_message_by_offset(self, commitlog_offset: int) -> rec.StoredMessage | None:
        """The record starting at ``commitlog_offset``, or None if no valid record starts
        there."""
        await trio.lowlevel.checkpoint()
        return self._decode_at(commitlog_offset)

    def _store_timestamp_at(self, commitlog_offset: int) -> int | None:
        segment = self.commitlog.segments.find(commitlog_offset)
        if segment is None:
            return None
        head = segment.read(commitlog_offset - segment.base_offset, _STORE_TIMESTAMP_HEAD)
        if len(head) < layout.SYSFLAG_AT + 4:
            return None
        if len(head) < layout.store_timestamp_at(layout.read_sys_flag(head)) + 8:
            return None
        return layout.read_store_timestamp(head)

    def get_offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp: int) -> int:
        """The first queue offset whose message was stored at or after ``timestamp`` (ms);
        the queue's max offset when every message is older. Binary search: store times
        rise with commitlog offset, so they rise along a queue too."""
        queue = self.queues.get(topic, queue_id)
        if queue is None:
            return 0
        low, high = queue.min_offset, queue.max_offset
        while low < high:
            middle = (low + high) // 2
            entry = queue.entry(middle)
            stamp = None if entry is None else self._store_timestamp_at(entry.commitlog_offset)
            if stamp is None or stamp < timestamp:
                low = middle + 1
            else:
                high = middle
        return low

    def get_message_store_timestamp(
        self, topic: str, queue_id: int, queue_offset: int
    ) -> int | None:
        queue = self.queues.get(topic, queue_id)
        entry = queue.entry(queue_offset) if queue is not None else None
        return None if entry is None else self._store_timestamp_at(entry.commitlog_offset)

    def get_earliest_message_time(self, topic: str, queue_id: int) -> int | None:
        first = self.min_queue_offset(topic, queue_id)
        return self.get_message_store_timestamp(topic, queue_id, first)

    async def wait_dispatched(self, offset: int | None = None) -> None:
        """Wait until consume queues cover the log up to ``offset`` (default: everything
        written so far)."""
        target = self.commitlog.max_offset if offset is None else offset
        await self.dispatcher.dispatched.wait_for(target)

    async def flush(self) -> int:
        """Flush the commitlog now; returns the flushed offset."""
        return await self.commitlog.flush(0)

    def statistics(self) -> StoreStatistics:
        return StoreStatistics(
            backend=_backend.native_backend,
            min_commitlog_offset=self.commitlog.min_offset,
            max_commitlog_offset=self.commitlog.max_offset,
            flushed_offset=self.commitlog.flushed.value,
            flushes=self.commitlog.flush_count,
            dispatched_offset=self.dispatcher.cursor,
            dispatch_behind_bytes=self.dispatcher.behind_bytes,
            consume_queues=len(self.queues.queues),
            segments=len(self.commitlog.segments.segments),
            puts=self._puts,
            put_failures=self._put_failures,
            dispatch_error=self.dispatcher.error,
            recovery=self.recovery,
            unverified_reads=self._verifier.failures if self._verifier is not None else 0,
            health=self.health(),
            ha=self.ha_service.statistics() if self.ha_service is not None else None,
            ha_slave=self.ha_client.statistics() if self.ha_client is not None else None,
            group_commit=(
                self.group_commit.statistics() if self.group_commit is not None else None
            ),
            group_transfer=(
                self.group_transfer.statistics() if self.group_transfer is not None else None
            ),
        )

    def replicate_now(self) -> None:
        """Send attached slaves what the log gained since their last frame, now, from the
        caller's task, where a slave's link is idle (``HAService.push_now``). A server calls
        it after serving the requests of one read: that round's puts leave in one frame, a
        scheduling round sooner than the HA writers would send them. Nothing without slaves;
        never raises (what cannot be written now, the writers send)."""
        if self.ha_service is not None:
            self.ha_service.push_now()

    @property
    def ha_address(self) -> tuple[str, int] | None:
        """Where this store's HA service listens (None without one)."""
        return self.ha_service.listen_address if self.ha_service is not None else None


def _encode_status(code: int) -> PutMessageStatus:
    if code == _backend.ERR_PROPS_TOO_LARGE:
        return PutMessageStatus.PROPERTIES_SIZE_EXCEEDED
    if code in (_backend.ERR_BODY_TOO_LARGE, _backend.ERR_BATCH_FORMAT, _backend.ERR_NO_SPACE,
                _backend.ERR_BAD_ARGUMENT, _backend.ERR_TOO_MANY):
        return PutMessageStatus.MESSAGE_ILLEGAL
    return PutMessageStatus.UNKNOWN_ERROR


def _encode_error(code: int, topic_len: int) -> str:
    return {
        _backend.ERR_NO_SPACE: "record larger than a commitlog segment",
        _backend.ERR_BAD_ARGUMENT: f"bad record field (topic of {topic_len} bytes, host)",
        _backend.ERR_BATCH_FORMAT: "malformed batch body",
        _backend.ERR_BODY_TOO_LARGE: "a batch item's body exceeds maxMessageSize",
        _backend.ERR_PROPS_TOO_LARGE: f"properties exceed {rec.MAX_PROPERTIES_LENGTH} bytes",
        _backend.ERR_TOO_MANY: "too many items in one batch",
    }.get(code, f"encoder error {code}")


def max_record_size(config: StoreConfig) -> int:
    """The largest record a store with ``config`` takes or accepts when it scans."""
    return min(config.max_message_size + RECORD_OVERHEAD_LIMIT, layout.INT32_MAX)



@contextlib.asynccontextmanager
async def open_store(config: StoreConfig, *, lock: StoreLock | None = None):
    """Open (recovering if needed) the store at ``config.store_path_root_dir`` and run its
    services until the block ends; yields the MessageStore.

    The order keeps a failed start from touching the store: the directory's lock first (or
    the caller's ``lock``, taken before it did anything else), then the HA port, and only
    then recovery and the ``abort`` file. So a second broker on the same directory, or an HA
    port already taken, stops with the store as it was, and the next start is not mistaken
    for a crash. A lock the caller passes stays the caller's to release.
    """
    root = await trio.to_thread.run_sync(os.path.realpath, config.store_path_root_dir)
    if lock is not None and (lock.root != root or not lock.held):
        raise ValueError(f"open_store: the lock passed is for {lock.root}, not {root}")
    owned = lock is None
    if lock is None:
        lock = await trio.to_thread.run_sync(StoreLock.acquire, root)
    try:
        ha_listeners: list[trio.SocketListener] = []
        if config.ha_listen_port is not None:
            ha_listeners = await listen_named(config.ha_listen_port, config.ha_bind_address,
                                              "haListenPort")
        try:
            store = await trio.to_thread.run_sync(MessageStore._open_blocking, config, root)
        except BaseException:
            with trio.CancelScope(shield=True):
                for listener in ha_listeners:
                    await listener.aclose()
            raise
        try:
            with unwrap_single_exception():
                async with trio.open_nursery() as nursery:
                    await store._run_services(nursery, ha_listeners)
                    store._running = True
                    store._accepting = config.broker_role is not BrokerRole.SLAVE
                    try:
                        yield store
                    finally:
                        with trio.CancelScope(shield=True):
                            await store._shutdown()
                        nursery.cancel_scope.cancel()
        finally:
            store._closed = True
            store._close_files()
    finally:
        if owned:
            lock.release()


__all__ = [
    "MessageStore", "StoreLock", "StoreLockedError", "StoreStatistics", "open_store"
]
