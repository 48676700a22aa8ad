"""What a record engine is: the interface both engines implement, the values they return, and
the C header's codes.

The store, the dispatcher, recovery and the Spark reader code against ``RecordEngine``; which
engine fills it is the loader's choice (``_loader``). Keeping the interface here, apart from
both engines, is what lets the native engine and its Python twin each be read alone, beside the
code they mirror.

Buffers are *handles* made once per mapping by ``handle_for(buffer)`` and given back by
``release_handle``: a cffi pointer for the native engine, a memoryview for Python. The ERR_*,
STOP_*, SCAN_* and GATHER_* numbers are native/trio_ha_native.h's, so both engines return the
C code's values.
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol, TypeAlias

from ..wire import record as rec
from ._sync_thread import NativeSyncThread

# ---- the C header's codes (native/trio_ha_native.h) ----------------------------------------

ERR_NO_SPACE = -1
ERR_BAD_ARGUMENT = -2
ERR_BATCH_FORMAT = -3
ERR_BODY_TOO_LARGE = -4
ERR_PROPS_TOO_LARGE = -5
ERR_TOO_MANY = -6

STOP_END = 0
STOP_PARTIAL = 1
STOP_BLANK = 2
STOP_FULL = 3
STOP_BAD_MAGIC = 4
STOP_BAD_SIZE = 5
STOP_BAD_CRC = 6
#: the record's last byte is 0: its tail never reached the file (a torn record)
STOP_TORN = 7
STOP_NAMES = {
    STOP_END: "end", STOP_PARTIAL: "partial record", STOP_BLANK: "blank record",
    STOP_FULL: "output full", STOP_BAD_MAGIC: "bad magic", STOP_BAD_SIZE: "bad size",
    STOP_BAD_CRC: "body CRC mismatch",
    STOP_TORN: "torn record (its last bytes are zero)",
}

#: the smallest SEND_BATCH_MESSAGE item: 20 bytes of header and body length, 2 of props length
MIN_BATCH_ITEM = 22

SCAN_CHECK_CRC = 1
SCAN_TAGS = 2

# th_gather: what it decided for each consume-queue entry ...
GATHER_FOUND = 0
GATHER_REMOVED = 1
GATHER_FILTERED = 2
GATHER_ABSENT = 3
GATHER_INVALID = 4
# ... why it stopped ...
GATHER_END = 0
GATHER_COUNT = 1
GATHER_BYTES = 2
GATHER_SEGMENT = 3
# ... and its flag
GATHER_VERIFY = 1


# ---- the interface both engines implement --------------------------------------------------

#: A buffer as an engine sees it, made once per mapping by ``handle_for``: a cffi
#: ``uint8_t *`` for the native engine, a memoryview for the Python one. cffi's values carry
#: no static type, hence Any.
Handle: TypeAlias = Any
#: What ``handle_for`` and ``crc32`` accept: anything exposing the buffer protocol.
Buffer: TypeAlias = bytes | bytearray | memoryview | mmap.mmap


class RecordInfo:
    """One scanned record, as the native engine's th_record_info describes it (the Python
    engine makes these; the native one returns a cffi array of the C struct, same fields).
    Positions are relative to the scanned buffer."""

    __slots__ = (
        "phys_offset", "queue_offset", "born_timestamp", "store_timestamp",
        "prepared_tx_offset", "tags_code", "size", "queue_id", "flag", "sys_flag", "body_crc",
        "reconsume_times", "born_host_pos", "store_host_pos", "body_pos", "body_len",
        "topic_pos", "props_pos", "topic_len", "props_len", "born_host_len", "store_host_len",
        "version", "crc_ok",
    )
    phys_offset: int
    queue_offset: int
    born_timestamp: int
    store_timestamp: int
    prepared_tx_offset: int
    #: 0 unless scanned with SCAN_TAGS and the record has a non-empty TAGS property
    tags_code: int
    size: int
    queue_id: int
    flag: int
    sys_flag: int
    body_crc: int
    reconsume_times: int
    born_host_pos: int
    store_host_pos: int
    body_pos: int
    body_len: int
    topic_pos: int
    props_pos: int
    topic_len: int
    props_len: int
    born_host_len: int
    store_host_len: int
    version: int
    #: 1 ok, 0 mismatch (only with STOP_BAD_CRC), 2 unchecked
    crc_ok: int


class ScanResult:
    """Where a scan stopped and why; ``infos[:count]`` describe the records it passed.

    ``infos`` belongs to the scanner and is overwritten by its next scan."""

    __slots__ = ("count", "end", "stop", "size", "infos")

    def __init__(
        self, count: int, end: int, stop: int, size: int, infos: Sequence[RecordInfo]
    ) -> None:
        self.count = count
        #: the position just past the last whole valid record passed
        self.end = end
        #: one of the STOP_* codes
        self.stop = stop
        #: TOTALSIZE found at ``end`` when the scan stopped on a record, else 0
        self.size = size
        self.infos = infos

    @property
    def reason(self) -> str:
        return STOP_NAMES.get(self.stop, f"stop {self.stop}")


class CqRuns(NamedTuple):
    """A scan's records grouped into consume-queue runs (th_cq_runs in the C header): each
    run is records of one queue with consecutive queue offsets, other queues' records
    possibly between them."""

    #: (first record, count, last record, first entry) of each run, in order of first record
    runs: list[tuple[int, int, int, int]]
    #: the runs' 20-byte entries, one run after another
    entries: bytes | memoryview
    #: the record (its index in the scan) of each entry
    order: Sequence[int]


class GatherResult:
    """What one gather decided: ``entries`` consume-queue entries looked at, ``found``
    records to serve at ``records`` and, adjacent ones merged, ``spans`` — (position, length)
    pairs within the segment — and why it stopped (``stop``, a GATHER_* code). ``problems``
    entries were REMOVED, ABSENT or INVALID, the last of them ``last_problem``; ``outcomes``
    holds the outcome of each entry looked at (GATHER_FOUND ... GATHER_INVALID)."""

    __slots__ = ("entries", "found", "stop", "bytes", "last_phys", "problems", "last_problem",
                 "spans", "records", "outcomes")

    def __init__(self, entries: int, found: int, stop: int, size: int, last_phys: int,
                 problems: int, last_problem: int, spans: list[tuple[int, int]],
                 records: list[tuple[int, int]], outcomes: bytes) -> None:
        self.entries = entries
        self.found = found
        self.stop = stop
        #: bytes of the records found
        self.bytes = size
        #: commitlog offset of the last record found (-1: none)
        self.last_phys = last_phys
        self.problems = problems
        self.last_problem = last_problem
        self.spans = spans
        self.records = records
        self.outcomes = outcomes


class Gatherer(Protocol):
    """Decides a run of one queue's consume-queue entries against one commitlog segment: the
    records a pull serves (th_gather in the C header says exactly how)."""

    def gather(self, handle: Handle, seg_size: int, base_offset: int, min_offset: int,
               readable_end: int, entries: Buffer, tag_codes: Sequence[int] | None,
               topic: bytes, queue_id: int, first_queue_offset: int, flags: int,
               max_record: int, max_count: int, max_bytes: int, bytes_before: int = 0
               ) -> GatherResult: ...


class Scanner(Protocol):
    """Validates records in a buffer and describes up to its capacity of them per call."""

    def scan(self, handle: Handle, limit: int, pos: int, base_offset: int, flags: int,
             max_record: int) -> ScanResult:
        """Scan ``[pos, limit)`` of the buffer whose first byte is commitlog offset
        ``base_offset``; ``flags`` are SCAN_* bits; a TOTALSIZE above ``max_record`` stops."""
        ...


class RecordEngine(Protocol):
    """The record engine: encodes records into a segment's mapping, scans and CRCs them, and
    does the page work (msync, warm, zero, fallocate) for segments. Encoders return the new
    position, or one of the ERR_* codes (negative)."""

    name: str

    def handle_for(self, buffer: Buffer) -> Handle: ...

    def release_handle(self, handle: Handle) -> None:
        """Give back a handle before its mapping closes (a live one keeps the mmap busy)."""
        ...

    def crc32(self, data: Buffer) -> int:
        """BODYCRC: zlib's CRC-32 masked as RocketMQ stores it."""
        ...

    def java_hash(self, utf8: bytes) -> int: ...

    def encode_record(
        self, handle: Handle, seg_size: int, pos: int, base_offset: int, topic: bytes,
        body: bytes, props: bytes, queue_id: int, flag: int, queue_offset: int, sys_flag: int,
        born_ts: int, born_host: bytes, store_ts: int, store_host: bytes,
        reconsume_times: int, prepared_offset: int,
    ) -> int: ...

    def encode_batch(
        self, handle: Handle, seg_size: int, pos: int, base_offset: int, items: bytes,
        topic: bytes, batch_props: bytes, queue_id: int, first_queue_offset: int,
        sys_flag: int, born_ts: int, born_host: bytes, store_ts: int, store_host: bytes,
        max_body_size: int,
    ) -> tuple[int, list[int]]:
        """Encode a SEND_BATCH_MESSAGE body's items as consecutive records: (new position,
        the commitlog offset of each record), or (ERR_*, [])."""
        ...

    def scanner(self, capacity: int) -> Scanner: ...

    def gatherer(self) -> Gatherer: ...

    def decode_records(
        self, buf: bytes, *, max_size: int = rec.MAX_DECODED_RECORD,
        extra_properties: dict[str, str] | None = None,
    ) -> list[rec.StoredMessage]:
        """Every record of ``buf`` (a pull response's body: whole records, back to back)
        decoded, as ``rec.decode_record`` decodes one; RecordDecodeError if one is not whole
        and valid (the body CRC is not checked, as RocketMQ clients do not)."""
        ...

    def cq_runs(self, handle: Handle, result: ScanResult) -> CqRuns:
        """Group a scan's records into consume-queue runs (``CqRuns``)."""
        ...

    def index_put(self, index: Handle, slot_num: int, index_num: int, handle: Handle,
                  result: ScanResult, first: int) -> int:
        """Put the keys of the scanned records ``first``.. into the index file ``index``
        (see th_index_put in the C header); how many records were done."""
        ...

    def msync(self, handle: Handle, start: int, length: int) -> None: ...

    def start_sync_thread(self, done_fd: int) -> NativeSyncThread | None:
        """A thread of its own that msyncs ranges without the interpreter's lock, telling
        ``done_fd`` (an eventfd) when each is done; None where the engine has none (the
        Python engine: a worker thread syncs instead)."""
        ...

    def warm(self, handle: Handle, start: int, length: int) -> None: ...

    def zero(self, handle: Handle, start: int, length: int) -> None: ...

    def fallocate(self, fd: int, offset: int, length: int) -> None: ...

    def sendfile(self, out_fd: int, in_fd: int, offset: int, count: int) -> int:
        """A non-blocking sendfile: bytes sent, or -errno (-EAGAIN when the socket is full),
        never an exception, so the HA writer can wait for writability and retry."""
        ...

    def splice_to_file(self, sock_fd: int, pipe: tuple[int, int], file_fd: int, offset: int,
                       count: int) -> int:
        """Up to ``count`` bytes from a non-blocking socket into a file at ``offset`` with no
        copy through user space (socket -> ``pipe`` (read end, write end) -> file): the bytes
        now in the file, 0 when the peer closed, or -errno (-EAGAIN: none ready; -EINVAL,
        -ENOSYS: this socket or system splices nothing, and nothing was taken). Never an
        exception, like ``sendfile``. A file that takes no splice gets the bytes copied."""
        ...
