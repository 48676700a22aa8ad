"""MessageStore: the commitlog, its consume queues and the services that keep them, as one
object — the store's public face.

A put is a value (``PutRequest``): ``append_now(request)`` appends it from the caller's task
without a task switch (the broker answers a send from the reader's round), and
``put(request)`` does the same from a task that may wait — for the next segment before the
append, and for the store's promise after it. The append itself is ``CommitLog.append``;
when the store promises more than "in the page cache", the put then waits for its answers
from group commit and group transfer (``sync_requests``).

What has logic of its own lives in its own module: opening, running and closing the store
(``opening``: ``open_store``), whether a put is taken and its checked fields (``admission``),
reads and look-ups (``reads``), the consume-queue flush (``queue_flush``), what the store
reports (``statistics``), cutting the log back (``truncation``), how far readers see the log
in controller mode (``confirm``: the confirm offset), and below them ``commitlog``,
``consume_queue``, ``dispatch``, ``recovery``, ``retention``, ``group_commit`` and ``ha``.
The store's role (master or slave) may change while it runs: ``roles`` says how, and
``controller_roles`` how in controller mode. What stays here is what the store holds, the
put path, and what a caller sees: ``MessageStore`` binds those modules' functions as its
methods (``store.read_queue(...)``, ``store.change_to_master(...)``, ``store.statistics()``
are theirs, called on the store), which costs a call nothing.

Everything here runs on one trio event loop; blocking work (file creation, msync/fdatasync,
recovery scans) is handed to worker threads.
"""

from __future__ import annotations

import logging
from collections.abc import Coroutine, Sequence
from typing import Any

import attrs
import trio

import trio_ha._backend as _backend

from ..config import BrokerRole, FlushDiskType, StoreConfig
from ..ratelog import RateLimitedLog
from ..watermark import Watermark
from ..wire import layout
from ..wire import record as rec
from . import controller_roles, queue_flush, reads, roles, truncation
from .admission import Admission
from .checkpoint import Checkpoint
from .commitlog import CommitLog, SegmentUnavailable, encode_batch, encode_message
from .confirm import ConfirmOffset
from .consume_queue import ConsumeQueueTable
from .dispatch import Dispatcher
from .group_commit import GroupCommitService
from .ha.epochs import EpochFile
from .ha.group_transfer import GroupTransferService
from .ha.master import HAService
from .ha.slave import HAClient
from .ha.sync_state import SyncState
from .health import DiskMonitor
from .index import IndexService
from .lock import StoreLock, StoreLockedError
from .put_request import PutRequest
from .recovery import RecoveryReport
from .results import PutMessageResult, PutMessageStatus
from .statistics import StoreStatistics, store_health, store_statistics
from .sync_requests import PendingPut
from .verify import RecordVerifier

log = logging.getLogger(__name__)


@attrs.define(eq=False)
class MessageStore:
    config: StoreConfig
    commitlog: CommitLog
    queues: ConsumeQueueTable
    dispatcher: Dispatcher
    checkpoint: Checkpoint
    recovery: RecoveryReport | None = None
    _root: str = attrs.field(default="", alias="root")
    #: the services of the current role, in their own cancel scope (None until it runs)
    role_scope: roles.RoleScope | None = None
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
    verifier: RecordVerifier | None = None
    #: decides consume-queue entries against the commitlog for reads (read_queue)
    gatherer: _backend.Gatherer = attrs.field(init=False,
                                              factory=lambda: _backend.engine.gatherer())
    #: why puts are refused for disk use (None: they are not), and the use at the last look
    #: refuses puts above diskSpaceWarningLevelRatio (set up by the constructor)
    disk: DiskMonitor = attrs.field(init=False)
    #: whether a put is taken now (running, open, role, a cut, the in-sync gate), the checks
    #: and caches of its fields, and the counts of puts taken and refused (``admission``)
    admission: Admission = attrs.field(init=False)
    #: what the store's services could not do, at most once every 10 s per kind
    health_log: RateLimitedLog = attrs.field(factory=lambda: RateLimitedLog(log))
    #: the epoch history of controller mode, for whoever runs it (None: the store keeps
    #: none in memory; a truncation still cuts the file at storePathEpochFile if one exists)
    epochs: EpochFile | None = None
    #: the commitlog's own mark for readers: flushed bytes under SYNC_FLUSH, written ones
    #: otherwise (``log_mark``)
    _log_mark: Watermark = attrs.field(init=False)
    #: what readers and the dispatcher follow (``confirmed``): ``_log_mark`` on a classic
    #: store, the confirm offset in controller mode
    _visible: Watermark = attrs.field(init=False)
    #: controller mode: the confirm offset and what it follows (None: a classic store)
    confirm: ConfirmOffset | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        commitlog = self.commitlog
        self._log_mark = self._visible = (
            commitlog.flushed if self.config.flush_disk_type is FlushDiskType.SYNC_FLUSH
            else commitlog.written
        )
        if self.config.enable_controller_mode:
            self.confirm = ConfirmOffset(self._log_mark)
            self._visible = self.confirm.visible
        self.disk = DiskMonitor(
            (self.config.commitlog_dir, self.queues.root),
            self.config.disk_space_warning_level_ratio,
        )
        self.admission = Admission(self.config, self.dispatcher, self.disk,
                                   commitlog.store_host, self.config.broker_role)

    @property
    def root(self) -> str:
        return self._root

    @property
    def confirmed(self) -> Watermark:
        """What consumers may see, and how far the consume queues are built: flushed bytes
        under SYNC_FLUSH, written ones otherwise; in controller mode, the confirm offset
        (``confirm``), which stays at or below that."""
        return self._visible

    @property
    def log_mark(self) -> Watermark:
        """The commitlog's own mark for readers: flushed bytes under SYNC_FLUSH, written
        ones otherwise (``confirmed`` on a classic store)."""
        return self._log_mark

    def check_disk(self) -> None:
        """Look at the disk use now (the store's task does it every second)."""
        self.disk.check()

    health = store_health
    statistics = store_statistics
    flush_consume_queues = queue_flush.flush_consume_queues

    # ---- its life (``opening.open_store`` drives it) ---------------------------------------

    def mark_running(self) -> None:
        """The services run: puts may come (a master's; a slave takes none)."""
        self.admission.mark_running()

    def mark_closed(self) -> None:
        """Closing or closed: every put from now on is refused."""
        self.admission.mark_closed()

    # ---- its role (``roles``, ``controller_roles``) ----------------------------------------

    @property
    def role(self) -> BrokerRole:
        """SYNC_MASTER, ASYNC_MASTER or SLAVE: the configured role until it changes."""
        return self.admission.role

    def take_role(self, role: BrokerRole) -> None:
        """(``roles``, once the role's services run) Puts from now on are those of
        ``role``: refused on a slave, waiting for slaves on a SYNC_MASTER."""
        self._waits = roles.waits_for(role, self.config.flush_disk_type)
        self.admission.take_role(role)

    def gate_puts(self, sync_state: SyncState | None) -> None:
        """(``controller_roles``) Puts that wait for slaves (WAIT=true) are refused,
        IN_SYNC_REPLICAS_NOT_ENOUGH, while ``sync_state`` does not admit them (its set, or
        the proposal in flight, smaller than minInSyncReplicas), as RocketMQ's CommitLog
        refuses them before the append. None: no such check. A term whose
        minInSyncReplicas is 1 needs none (the set always holds its master), so its puts
        keep the fast path; a store with a gate sends every put through the full check."""
        self.admission.gate(sync_state)

    change_to_master = roles.change_to_master
    change_to_slave = roles.change_to_slave
    change_to_controller_slave = controller_roles.change_to_slave
    raise_replicated = controller_roles.raise_replicated
    follow_confirm = controller_roles.follow_confirm

    async def change_to_controller_master(self, *, epoch: int, broker_id: int,
                                          sync_state_set: frozenset[int],
                                          sync_state_set_epoch: int) -> SyncState:
        """Controller mode: become the SYNC_MASTER of master epoch ``epoch`` with the in-sync
        set the controller named; the term's in-sync set is returned, for the controller link
        to propose and apply changes to (``controller_roles``)."""
        term = await controller_roles.change_to_master(
            self, epoch=epoch, broker_id=broker_id, sync_state_set=sync_state_set,
            sync_state_set_epoch=sync_state_set_epoch)
        return term.sync_state

    # ---- puts -------------------------------------------------------------------------------

    async def put(self, request: PutRequest) -> PutMessageResult:
        """Append what ``request`` carries; the result says whether it is stored, and how
        durably.

        Cancellation is looked at first, before anything is written: a cancelled put has not
        happened, and a put that happened is never turned into a Cancelled exception (except
        while it waits for SYNC_FLUSH or slaves, where the caller chose to stop waiting). The
        put yields once, after its append (``_finish``): a SYNC_MASTER put appends in the
        round its request is read and its bytes go to the slave in the next."""
        await trio.lowlevel.checkpoint_if_cancelled()
        if request.is_batch:
            appended = self._append_batch(request)
        else:
            appended = self._append_message(request)
        if appended is None:
            appended = await self._appended(request)
        return await self._finish(appended, request.wait_store_msg_ok)

    def append_now(self, request: PutRequest) -> PutMessageResult | PendingPut | None:
        """``put`` without a task switch, for a caller that cannot wait in place (the broker
        answers a send from the reader's round): the result; or, for a put that
        must wait for SYNC_FLUSH or slaves, its ``PendingPut``; or None, with nothing of it
        appended, when the put would have to wait for a new segment first (then call
        ``put``; the full segment may have been closed already)."""
        if request.is_batch:
            appended = self._append_batch(request)
        else:
            appended = self._append_message(request)
        if appended is None or not self._will_wait(appended, request.wait_store_msg_ok):
            return appended
        return self._pending(appended)

    def put_message(
        self, message: rec.Message, queue_id: int = 0
    ) -> Coroutine[Any, Any, PutMessageResult]:
        """Append one message: ``await store.put_message(message)`` is ``put`` of
        ``PutRequest.of_message``. (A function returning ``put``'s coroutine rather than a
        coroutine of its own: a single put's Python is what bounds its rate, and a second
        coroutine would add its cost to the request's; docs/performance.md.)"""
        return self.put(PutRequest.of_message(message, queue_id))

    async def put_messages(
        self, messages: Sequence[rec.Message], queue_id: int = 0
    ) -> PutMessageResult:
        """Append a batch of messages of one topic to one queue, all or nothing, with
        consecutive queue and commitlog offsets (SEND_BATCH_MESSAGE semantics)."""
        messages = list(messages)
        if len({m.topic for m in messages}) != 1:
            await trio.lowlevel.checkpoint()
            return self.admission.refuse("a batch needs at least one message, all of one topic")
        if any(m.sys_flag & rec.TRANSACTION_TYPE_MASK for m in messages):
            await trio.lowlevel.checkpoint()
            return self.admission.refuse("transaction messages cannot be batched")
        try:
            request = PutRequest.of_messages(messages, queue_id)
        except ValueError as exc:
            await trio.lowlevel.checkpoint()
            return self.admission.refuse(str(exc), PutMessageStatus.PROPERTIES_SIZE_EXCEEDED)
        return await self.put(request)

    async def _appended(self, request: PutRequest) -> PutMessageResult:
        """What ``request`` appended once the next segment is there, after waiting for it as
        often as it needs one (a put's only await before its append; ``put`` comes here
        only when its first try found the segment full, so a put that fits pays no
        coroutine for it)."""
        append = self._append_batch if request.is_batch else self._append_message
        while (appended := append(request)) is None:
            try:
                await self.commitlog.wait_for_segment()
            except SegmentUnavailable as exc:
                return self.admission.refuse(str(exc),
                                             PutMessageStatus.CREATE_MAPEDFILE_FAILED)
        return appended

    def _append_message(self, request: PutRequest) -> PutMessageResult | None:
        """The append of one message; None (nothing of it appended) when it must wait for
        the next segment (``_appended``)."""
        topic, queue_id, body = request.topic, request.queue_id, request.body
        admission = self.admission  # (the one attribute load the split costs a put)
        topic_bytes = admission.accepts(topic, queue_id, len(body))
        if topic_bytes is None:
            admitted = admission.admit(topic, queue_id, len(body), request.wait_store_msg_ok)
            if isinstance(admitted, PutMessageResult):
                return admitted
            topic_bytes = admitted
        properties = request.properties
        if len(properties) > rec.MAX_PROPERTIES_LENGTH:
            return admission.refuse(
                f"properties of {len(properties)} bytes exceed {rec.MAX_PROPERTIES_LENGTH}",
                PutMessageStatus.PROPERTIES_SIZE_EXCEEDED,
            )
        if properties and properties[-1] == 0:  # (an index, not a slice: no copy per put)
            # A record never ends in a 0 byte: recovery takes one that does for a torn record.
            return admission.refuse("the properties end in a NUL byte (a property value may not)")
        sys_flag = request.sys_flag
        tx_type = sys_flag & layout.TRANSACTION_TYPE_MASK
        consumable = (
            tx_type != layout.TRANSACTION_PREPARED and tx_type != layout.TRANSACTION_ROLLBACK
        )
        born_host = request.born_host  # (None, the store's own: no call for it)
        item = (
            topic_bytes, body, properties, queue_id, request.flag, sys_flag,
            request.born_timestamp,
            self.commitlog.store_host if born_host is None else admission.born_host(born_host),
            request.reconsume_times, request.prepared_transaction_offset,
        )
        appended = self.commitlog.append_now(
            encode_message, item, (topic, queue_id) if consumable else None
        )
        if appended is None:
            return None
        if isinstance(appended, int):
            return admission.encoder_refused(appended, len(topic_bytes))
        admission.puts += 1
        return appended

    def _append_batch(self, request: PutRequest) -> PutMessageResult | None:
        """The append of an encoded batch; None as in ``_append_message``."""
        topic, queue_id, body = request.topic, request.queue_id, request.body
        admission = self.admission  # (the one attribute load the split costs a put)
        topic_bytes = admission.accepts(topic, queue_id, len(body))
        if topic_bytes is None:
            # The whole body counts against maxMessageSize, as RocketMQ checks a batch.
            admitted = admission.admit(topic, queue_id, len(body), request.wait_store_msg_ok)
            if isinstance(admitted, PutMessageResult):
                return admitted
            topic_bytes = admitted
        sys_flag = request.sys_flag
        if sys_flag & layout.TRANSACTION_TYPE_MASK:
            return admission.refuse("transaction messages cannot be batched")
        item = (
            body, topic_bytes, request.properties, queue_id, sys_flag,
            request.born_timestamp, admission.born_host(request.born_host),
            self.config.max_message_size,
        )
        appended = self.commitlog.append_now(encode_batch, item, (topic, queue_id))
        if appended is None:
            return None
        if isinstance(appended, int):
            return admission.encoder_refused(appended, len(topic_bytes))
        admission.puts += appended.count
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
            no_replicas=(group_transfer is None
                         and self.admission.role is BrokerRole.SYNC_MASTER),
        )

    # ---- reads (``reads``) --------------------------------------------------------------------

    @property
    def min_commitlog_offset(self) -> int:
        return self.commitlog.min_offset

    @property
    def max_commitlog_offset(self) -> int:
        """One past the last byte readers may see (the confirmed end of the log)."""
        return self.confirmed.value

    max_queue_offset = reads.max_queue_offset
    min_queue_offset = reads.min_queue_offset
    topics = reads.topics
    record_bytes = reads.record_bytes
    queue_entries = reads.queue_entries
    queue_arrivals = reads.queue_arrivals
    read_queue = reads.read_queue
    get_messages = reads.get_messages
    query_message = reads.query_message
    look_message_by_offset = reads.look_message_by_offset
    get_offset_in_queue_by_time = reads.get_offset_in_queue_by_time
    get_message_store_timestamp = reads.get_message_store_timestamp
    get_earliest_message_time = reads.get_earliest_message_time

    # ---- the rest of the face ---------------------------------------------------------------

    async def wait_dispatched(self, offset: int | None = None) -> None:
        """Wait until consume queues cover the log up to ``offset`` (default: everything
        written so far)."""
        target = self.commitlog.max_offset if offset is None else offset
        await self.dispatcher.dispatched.wait_for(target)

    async def flush(self) -> int:
        """Flush the commitlog now; returns the flushed offset."""
        return await self.commitlog.flush(0)

    truncate_to = truncation.truncate_to

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


__all__ = ["MessageStore", "PutRequest", "StoreLock", "StoreLockedError", "StoreStatistics"]
