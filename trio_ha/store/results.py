"""Statuses and results of store operations, with RocketMQ's names."""

from __future__ import annotations

import enum

import attrs

from ..wire.record import StoredMessage, joined_message_ids, message_id


class PutMessageStatus(enum.Enum):
    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    CREATE_MAPEDFILE_FAILED = "CREATE_MAPEDFILE_FAILED"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    OS_PAGECACHE_BUSY = "OS_PAGECACHE_BUSY"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"
    #: a controller-mode master whose in-sync set is smaller than minInSyncReplicas refuses
    #: a put that would wait for slaves, before anything is written (not stored)
    IN_SYNC_REPLICAS_NOT_ENOUGH = "IN_SYNC_REPLICAS_NOT_ENOUGH"

    @property
    def stored(self) -> bool:
        """The message is in the commitlog (RocketMQ counts these as sent)."""
        return self in _STORED


_STORED = {
    PutMessageStatus.PUT_OK,
    PutMessageStatus.FLUSH_DISK_TIMEOUT,
    PutMessageStatus.FLUSH_SLAVE_TIMEOUT,
    PutMessageStatus.SLAVE_NOT_AVAILABLE,
}


class GetMessageStatus(enum.Enum):
    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"


@attrs.frozen
class PutMessageResult:
    """What a put did. For a batch, ``record_offsets`` and ``msg_ids`` cover every stored
    record, ``commitlog_offset``/``queue_offset`` are those of the first, ``size`` the total."""

    status: PutMessageStatus
    commitlog_offset: int = -1
    size: int = 0
    queue_offset: int = -1
    #: commitlog offset of each stored record
    record_offsets: tuple[int, ...] = ()
    store_timestamp: int = 0
    remark: str = ""
    store_host: bytes = b""

    @property
    def msg_ids(self) -> tuple[str, ...]:
        """RocketMQ's offsetMsgId of each record (made on demand: most callers never ask)."""
        return tuple(message_id(self.store_host, offset) for offset in self.record_offsets)

    @property
    def msg_id(self) -> str:
        """The offsetMsgId; comma-joined for a batch, as the broker returns it."""
        return joined_message_ids(self.store_host, self.record_offsets)

    @property
    def count(self) -> int:
        return len(self.record_offsets)

    @property
    def ok(self) -> bool:
        return self.status is PutMessageStatus.PUT_OK


@attrs.frozen
class GetMessageResult:
    """A read of one consume queue: the messages found and where the next read starts."""

    status: GetMessageStatus
    messages: tuple[StoredMessage, ...] = ()
    next_begin_offset: int = 0
    min_offset: int = 0
    max_offset: int = 0
    #: with ``raw=True``: each record's bytes, unchanged, as a view of its mapped segment (a
    #: view keeps the mapping alive after retention deletes the file; it shows the bytes as
    #: they are in the log, so it is sent soon, not kept)
    records: tuple[memoryview, ...] = ()
    #: commitlog offset of the last message returned (-1: none)
    last_commitlog_offset: int = -1
    #: with ``raw=True``: the same bytes as ``records``, adjacent records in one view (what a
    #: pull response sends, from the mapping to the socket)
    spans: tuple[memoryview, ...] = ()


@attrs.frozen
class QueryMessageResult:
    """What a query by key found (QUERY_MESSAGE): whole records, newest first, and the
    newest index file's end time and end offset (the response's indexLastUpdateTimestamp and
    indexLastUpdatePhyoffset)."""

    records: list[bytes]
    index_last_update_timestamp: int
    index_last_update_phy_offset: int
