"""The record engine: the native cffi module when it is built, a pure-Python twin otherwise.

Why two: the C module (native/, built as ``trio_ha._native``) encodes straight into a
segment's mmap, scans and CRCs records without per-byte Python work and with the GIL released.
The Python twin exists so the package still works where no compiler is available, and so the
tests can hold the C code against an independent implementation. ``native_backend`` says which
one loaded; with ``TRIO_HA_REQUIRE_NATIVE=1`` (as CI runs) a missing or stale native module is
an import error, never a silent fallback.

The module is long because it holds both engines side by side: the twin is meant to be read
beside the C code, and the interface both implement is defined here too.

Both engines share one interface, the ``RecordEngine`` protocol. Buffers are *handles* made
once per mapping by ``handle_for(buffer)`` and given back by ``release_handle``: a cffi pointer
for the native engine, a memoryview for Python. Where the Python twin reads or writes stored
bytes by position, it takes the positions from ``wire.layout``, as the C code mirrors them.
"""

from __future__ import annotations

import errno
import importlib
import mmap
import os
import struct
import zlib
from collections.abc import Iterable, Sequence
from types import ModuleType
from typing import Any, NamedTuple, Protocol, TypeAlias

from ._errors import TrioHAError
from .wire import layout
from .wire import record as rec

__all__ = [
    "NATIVE_VERSION", "native_backend", "ERR_NO_SPACE", "ERR_BAD_ARGUMENT",
    "ERR_BATCH_FORMAT", "ERR_BODY_TOO_LARGE", "ERR_PROPS_TOO_LARGE", "ERR_TOO_MANY",
    "STOP_END", "STOP_PARTIAL", "STOP_BLANK", "STOP_FULL", "STOP_BAD_MAGIC", "STOP_BAD_SIZE",
    "STOP_BAD_CRC", "STOP_TORN", "SCAN_CHECK_CRC", "SCAN_TAGS", "RecordEngine", "Scanner",
    "ScanResult", "CqRuns",
    "RecordInfo", "Handle", "engine", "python_engine", "GATHER_FOUND", "GATHER_REMOVED",
    "GATHER_FILTERED", "GATHER_ABSENT", "GATHER_INVALID", "GATHER_END", "GATHER_COUNT",
    "GATHER_BYTES", "GATHER_SEGMENT", "GATHER_VERIFY", "GatherResult", "Gatherer",
]

# Must equal TH_NATIVE_VERSION in native/trio_ha_native.h.
NATIVE_VERSION = 6

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

_SPAN = struct.Struct("=QQ")


class NativeModuleError(TrioHAError, ImportError):
    """The native module is required (TRIO_HA_REQUIRE_NATIVE=1) but missing or stale."""


def _load_native() -> tuple[ModuleType | None, str | None]:
    try:
        # By name, not `from . import _native`: the checkers then need no built module.
        _native = importlib.import_module("trio_ha._native")
    except ImportError as exc:
        return None, f"not built ({exc})"
    found = _native.lib.th_version()
    if found != NATIVE_VERSION:
        return None, f"stale build: C version {found}, Python expects {NATIVE_VERSION}"
    return _native, None


#: the cffi module ``trio_ha._native`` when it loaded and matches NATIVE_VERSION, else None
native_module, native_unavailable_reason = _load_native()
if native_module is None and os.environ.get("TRIO_HA_REQUIRE_NATIVE") == "1":
    raise NativeModuleError(
        f"TRIO_HA_REQUIRE_NATIVE=1 but trio_ha._native is unusable: {native_unavailable_reason}; "
        "reinstall the package (pip install -e .) with a C compiler and zlib headers"
    )

#: "native" or "python": which record engine this process uses.
native_backend = "native" if native_module is not None else "python"


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


# ---- the native engine ---------------------------------------------------------------------


class NativeSyncThread:
    """The C sync thread (``th_sync_thread_*``): one range at a time; ``submit`` it, wait for
    the done eventfd, then ``result``. Each call is a short C call under the thread's mutex."""

    def __init__(self, lib: Any, thread: Any) -> None:
        self._lib = lib
        self._thread = thread

    def submit(self, handle: Handle, start: int, length: int) -> None:
        """Start syncing ``[start, start + length)`` of the mapping ``handle``; the caller
        keeps the mapping alive until ``result`` says it is done."""
        if self._thread is None:
            raise RuntimeError("the sync thread has stopped")
        rc = self._lib.th_sync_thread_submit(self._thread, handle + start, length)
        if rc < 0:
            raise RuntimeError("the sync thread is busy with another range")

    def result(self) -> None:
        """Raises BlockingIOError while the range is in progress, OSError if msync failed."""
        rc = self._lib.th_sync_thread_result(self._thread)
        if rc == -errno.EBUSY:
            raise BlockingIOError(errno.EBUSY, "the range is still being synced")
        if rc < 0:
            raise OSError(-rc, f"msync: {os.strerror(-rc)}")

    def stop(self) -> None:
        """Let the range in progress finish, then end the thread (idempotent)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._lib.th_sync_thread_stop(thread)


class NativeEngine:
    """The C engine (``trio_ha._native``); each call is one C call that releases the GIL."""

    name = "native"

    def __init__(self, module: ModuleType) -> None:
        self.ffi: Any = module.ffi
        self.lib: Any = module.lib
        # Output arrays, grown on demand and reused: one allocation per size, not per call.
        self._batch_capacity = 0
        self._batch_out: Any = None
        self._batch_count: Any = self.ffi.new("size_t *")
        self._batch_entry_size: int = self.ffi.sizeof("th_batch_entry")
        self._runs_capacity = 0
        self._runs: Any = None
        self._entries: Any = None
        self._order: Any = None
        self._table: Any = None

    def handle_for(self, buffer: Buffer) -> Handle:
        return self.ffi.from_buffer(buffer, require_writable=False)

    def release_handle(self, handle: Handle) -> None:
        self.ffi.release(handle)

    def crc32(self, data: Buffer) -> int:
        return self.lib.th_crc32(self.ffi.from_buffer(data), len(data))

    def java_hash(self, utf8: bytes) -> int:
        return self.lib.th_java_hash(utf8, len(utf8))

    def encode_record(
        self, handle: Handle, seg_size: int, pos: int, base_offset: int, topic: bytes,
        body: bytes, props: bytes, queue_id: int, flag: int, queue_offset: int, sys_flag: int,
        born_ts: int, born_host: bytes, store_ts: int, store_host: bytes,
        reconsume_times: int, prepared_offset: int,
    ) -> int:
        return self.lib.th_encode_record(
            handle, seg_size, pos, base_offset, topic, len(topic), body, len(body), props,
            len(props), queue_id, flag, queue_offset, sys_flag, born_ts, born_host,
            len(born_host), store_ts, store_host, len(store_host), reconsume_times,
            prepared_offset,
        )

    def encode_batch(
        self, handle: Handle, seg_size: int, pos: int, base_offset: int, items: bytes,
        topic: bytes, batch_props: bytes, queue_id: int, first_queue_offset: int,
        sys_flag: int, born_ts: int, born_host: bytes, store_ts: int, store_host: bytes,
        max_body_size: int,
    ) -> tuple[int, list[int]]:
        # Every item takes at least 22 bytes, which bounds how many a body can hold.
        max_items = len(items) // MIN_BATCH_ITEM + 1
        if max_items > self._batch_capacity:
            self._batch_out = self.ffi.new("th_batch_entry[]", max_items)
            self._batch_capacity = max_items
        out = self._batch_out
        count = self._batch_count
        result = self.lib.th_encode_batch(
            handle, seg_size, pos, base_offset, self.ffi.from_buffer(items), len(items),
            topic, len(topic), batch_props, len(batch_props), queue_id, first_queue_offset,
            sys_flag, born_ts, born_host, len(born_host), store_ts, store_host,
            len(store_host), max_body_size, out, self._batch_capacity, count,
        )
        if result < 0:
            return result, []
        # phys_offset leads each entry: every stride-th int64 of the array, read in one go
        # (a cffi read per entry cost 4.7 us a batch of 64; this, 0.9).
        entries = self.ffi.buffer(out, count[0] * self._batch_entry_size)
        return result, memoryview(entries).cast("q")[:: self._batch_entry_size // 8].tolist()

    def scanner(self, capacity: int) -> NativeScanner:
        return NativeScanner(self, capacity)

    def gatherer(self) -> NativeGatherer:
        return NativeGatherer(self)

    def decode_records(
        self, buf: bytes, *, max_size: int = rec.MAX_DECODED_RECORD,
        extra_properties: dict[str, str] | None = None,
    ) -> list[rec.StoredMessage]:
        # One th_scan describes every record; the fields come out of its array as tuples by
        # struct, so the Python work per record is slicing and building the message.
        ffi = self.ffi
        capacity = len(buf) // MIN_RECORD_SIZE + 1
        infos = ffi.new("th_record_info[]", capacity)
        res = ffi.new("th_scan_result *")
        count = self.lib.th_scan(ffi.from_buffer(buf), len(buf), 0, 0, 0, max_size, infos,
                                 capacity, res)
        if res.stop != STOP_END:
            raise rec.RecordDecodeError(
                f"record at {res.end}: {STOP_NAMES.get(res.stop, res.stop)}"
                + (f" (TOTALSIZE {res.size})" if res.size else ""))
        fields = _RECORD_INFO.iter_unpack(ffi.buffer(infos, count * _RECORD_INFO.size))
        return _messages(buf, fields, extra_properties)

    def cq_runs(self, handle: Handle, result: ScanResult) -> CqRuns:
        count = result.count
        if count == 0:  # nothing allocated yet on a first empty scan; ffi.buffer(NULL) raises
            return CqRuns([], b"", ())
        ffi = self.ffi
        if count > self._runs_capacity:
            self._runs = ffi.new("th_cq_run[]", count)
            self._entries = ffi.new("uint8_t[]", count * layout.CQ_ENTRY_SIZE)
            self._order = ffi.new("uint32_t[]", count)
            self._table = ffi.new("uint32_t[]", _cq_table_size(count))
            self._runs_capacity = count
        # The table this scan needs (C clears it whole each call), not the capacity's.
        table_size = _cq_table_size(count)
        n = self.lib.th_cq_runs(handle, result.infos, count, self._entries, self._order,
                                self._runs, count, self._table, table_size)
        # One unpack for every run's four fields, not four cffi reads per run.
        fields = memoryview(ffi.buffer(self._runs, n * ffi.sizeof("th_cq_run"))).cast("I").tolist()
        runs = list(zip(fields[0::4], fields[1::4], fields[2::4], fields[3::4], strict=True))
        indexed = fields[-1] + fields[-3] if n else 0  # the last run's entry + count
        entries = memoryview(ffi.buffer(self._entries, indexed * layout.CQ_ENTRY_SIZE))
        order = memoryview(ffi.buffer(self._order, indexed * 4)).cast("I")
        return CqRuns(runs, entries, order)

    def index_put(self, index: Handle, slot_num: int, index_num: int, handle: Handle,
                  result: ScanResult, first: int) -> int:
        if first >= result.count:
            return 0
        infos: Any = result.infos  # a cffi th_record_info array: pointer arithmetic
        return self.lib.th_index_put(index, slot_num, index_num, handle, infos + first,
                                     result.count - first)

    def msync(self, handle: Handle, start: int, length: int) -> None:
        rc = self.lib.th_msync(handle + start, length)
        if rc < 0:
            raise OSError(-rc, f"msync: {os.strerror(-rc)}")

    def start_sync_thread(self, done_fd: int) -> NativeSyncThread:
        thread = self.lib.th_sync_thread_start(done_fd)
        if thread == self.ffi.NULL:
            code = self.ffi.errno or errno.EAGAIN
            raise OSError(code, f"starting the sync thread: {os.strerror(code)}")
        return NativeSyncThread(self.lib, thread)

    def warm(self, handle: Handle, start: int, length: int) -> None:
        rc = self.lib.th_warm(handle + start, length)
        if rc < 0:
            raise OSError(-rc, f"warming a segment: {os.strerror(-rc)}")

    def zero(self, handle: Handle, start: int, length: int) -> None:
        self.lib.th_zero(handle + start, length)

    def fallocate(self, fd: int, offset: int, length: int) -> None:
        rc = self.lib.th_fallocate(fd, offset, length)
        if rc not in (0, errno.EOPNOTSUPP, errno.EINVAL):
            raise OSError(rc, f"fallocate: {os.strerror(rc)}")

    def sendfile(self, out_fd: int, in_fd: int, offset: int, count: int) -> int:
        return self.lib.th_sendfile(out_fd, in_fd, offset, count)

    def splice_to_file(self, sock_fd: int, pipe: tuple[int, int], file_fd: int, offset: int,
                       count: int) -> int:
        return self.lib.th_splice_to_file(sock_fd, pipe[0], pipe[1], file_fd, offset, count)


class NativeScanner:
    """th_scan with its output arrays allocated once; its ScanResult's infos are a cffi array
    of th_record_info, reused by the next scan."""

    def __init__(self, engine: NativeEngine, capacity: int) -> None:
        self._lib = engine.lib
        self._capacity = capacity
        self._out: Any = engine.ffi.new("th_record_info[]", capacity)
        self._res: Any = engine.ffi.new("th_scan_result *")

    def scan(self, handle: Handle, limit: int, pos: int, base_offset: int, flags: int,
             max_record: int) -> ScanResult:
        n = self._lib.th_scan(handle, limit, pos, base_offset, flags, max_record, self._out,
                              self._capacity, self._res)
        res = self._res
        return ScanResult(n, res.end, res.stop, res.size, self._out)


class NativeGatherer:
    """th_gather with its output arrays grown on demand and reused."""

    def __init__(self, engine: NativeEngine) -> None:
        self._ffi = engine.ffi
        self._lib = engine.lib
        self._capacity = 0
        self._records: Any = None
        self._spans: Any = None
        self._outcomes: Any = None
        self._outcomes_capacity = 0
        self._res: Any = engine.ffi.new("th_gather_result *")

    def gather(self, handle: Handle, seg_size: int, base_offset: int, min_offset: int,
               readable_end: int, entries: Buffer, tag_codes: Sequence[int] | None,
               topic: bytes, queue_id: int, first_queue_offset: int, flags: int,
               max_record: int, max_count: int, max_bytes: int, bytes_before: int = 0
               ) -> GatherResult:
        ffi = self._ffi
        n = len(entries) // layout.CQ_ENTRY_SIZE
        if max_count > self._capacity or self._records is None:
            self._capacity = max(1, max_count)
            self._records = ffi.new("th_span[]", self._capacity)
            self._spans = ffi.new("th_span[]", self._capacity)
        if n > self._outcomes_capacity or self._outcomes is None:
            self._outcomes_capacity = max(1, n)
            self._outcomes = ffi.new("uint8_t[]", self._outcomes_capacity)
        if tag_codes is None:
            codes, n_tags = ffi.NULL, 0
        else:
            codes, n_tags = ffi.new("int64_t[]", list(tag_codes)), len(tag_codes)
        res = self._res
        self._lib.th_gather(handle, seg_size, base_offset, min_offset, readable_end,
                            ffi.from_buffer(entries), n, codes, n_tags, topic, len(topic),
                            queue_id, first_queue_offset, flags, max_record, max_count,
                            max_bytes, bytes_before, self._outcomes, self._records,
                            self._spans, res)
        found = res.found
        spans = list(_SPAN.iter_unpack(ffi.buffer(self._spans, res.spans * _SPAN.size))) \
            if res.spans else []
        records = spans if found == res.spans else \
            list(_SPAN.iter_unpack(ffi.buffer(self._records, found * _SPAN.size)))
        outcomes = ffi.buffer(self._outcomes, res.entries)[:]
        return GatherResult(res.entries, found, res.stop, res.bytes, res.last_phys,
                            res.problems, res.last_problem, spans, records, outcomes)


#: th_record_info as struct sees it (native layout: the C struct has no padding)
_RECORD_INFO = struct.Struct("@6q6i6I2H4B")
#: record_size(0, 0, 0): no record is smaller
MIN_RECORD_SIZE = 91
#: longer than any topic (a 16-bit length) or host field: matches no record's field
_NO_FIELD = bytes(1 << 16)


def _messages(buf: bytes, infos: Iterable[tuple[int, ...]],
              extra: dict[str, str] | None) -> list[rec.StoredMessage]:
    """StoredMessages from th_record_info tuples of records scanned in ``buf`` from 0."""
    messages = []
    # The records of one buffer nearly always share their topic and hosts: each field is
    # compared in place with the last record's (no slice) and decoded only when it differs.
    topic_raw = born_raw = store_raw = _NO_FIELD
    topic = born_host = store_host = ""
    decode_host = rec.decode_host
    physical_offset = layout.INT64.unpack_from
    for (
        pos, queue_offset, born_ts, store_ts, prepared, _tags, size, queue_id, flag, sys_flag,
        crc, reconsume_times, born_pos, store_pos, body_pos, body_len, topic_pos, props_pos,
        topic_len, props_len, born_len, store_len, version, _crc_ok,
    ) in infos:
        if topic_len != len(topic_raw) or not buf.startswith(topic_raw, topic_pos):
            topic_raw = buf[topic_pos : topic_pos + topic_len]
            try:
                topic = topic_raw.decode("utf-8")
            except UnicodeDecodeError:
                raise rec.RecordDecodeError(f"record at {pos}: topic is not UTF-8") from None
        if born_len != len(born_raw) or not buf.startswith(born_raw, born_pos):
            born_raw = buf[born_pos : born_pos + born_len]
            born_host = decode_host(born_raw)
        if store_len != len(store_raw) or not buf.startswith(store_raw, store_pos):
            store_raw = buf[store_pos : store_pos + store_len]
            store_host = decode_host(store_raw)
        messages.append(rec.StoredMessage(
            topic, queue_id, queue_offset,
            physical_offset(buf, pos + layout.PHYSICALOFFSET_AT)[0], size,
            buf[body_pos : body_pos + body_len], crc, flag, sys_flag, born_ts, born_host,
            store_ts, store_host, reconsume_times, prepared,
            buf[props_pos : props_pos + props_len], version, extra,
        ))
    return messages


# ---- the Python engine ----------------------------------------------------------------------

def _cq_table_size(count: int) -> int:
    """th_cq_runs's scratch table for ``count`` records: a power of two, at least twice it."""
    return 2 << (count - 1).bit_length()


def _cq_runs_python(buf: Buffer, infos: Sequence[RecordInfo], count: int) -> CqRuns:
    """th_cq_runs's twin: each record joins the latest run of its queue when its queue offset
    follows that run's last one, and starts that queue's next run otherwise."""
    runs: list[list[int]] = []  # [first, count, last, entry]
    latest: dict[tuple[bytes, int], int] = {}  # each queue's latest run
    run_of: list[int | None] = []  # each record's run
    for i in range(count):
        info = infos[i]
        tx_type = info.sys_flag & layout.TRANSACTION_TYPE_MASK
        if tx_type in (layout.TRANSACTION_PREPARED, layout.TRANSACTION_ROLLBACK):
            run_of.append(None)
            continue
        key = (bytes(buf[info.topic_pos : info.topic_pos + info.topic_len]), info.queue_id)
        k = latest.get(key)
        if k is not None:
            run = runs[k]
            last = infos[run[2]].queue_offset
            if last != layout.INT64_MAX and info.queue_offset == last + 1:
                run[1] += 1
                run[2] = i
                run_of.append(k)
                continue
        latest[key] = len(runs)
        run_of.append(len(runs))
        runs.append([i, 1, i, 0])
    at = 0
    for run in runs:
        run[3] = at
        at += run[1]
    next_entry = [run[3] for run in runs]
    entry_size = layout.CQ_ENTRY_SIZE
    entries = bytearray(at * entry_size)
    order = [0] * at
    for i, k in enumerate(run_of):
        if k is None:
            continue
        j = next_entry[k]
        next_entry[k] = j + 1
        info = infos[i]
        layout.CQ_ENTRY.pack_into(entries, j * entry_size, info.phys_offset, info.size,
                                  info.tags_code)
        order[j] = i
    return CqRuns([(run[0], run[1], run[2], run[3]) for run in runs], bytes(entries), order)


_INDEX_HEADER = struct.Struct(">qqqqii")
_INDEX_ENTRY = struct.Struct(">iqii")
_INDEX_SLOT = struct.Struct(">i")


def index_key_hash(key: str) -> int:
    """An index entry's key hash: |String.hashCode| of ``<topic>#<key>`` (MIN_VALUE counts as
    0), RocketMQ's ``indexKeyHashMethod``."""
    h = rec.java_string_hash(key)
    return 0 if h == -(2**31) else abs(h)


def _index_put_python(index: Handle, slot_num: int, index_num: int, buf: Buffer,
                      infos: Sequence[RecordInfo], first: int, count: int) -> int:
    """th_index_put's twin (RocketMQ's IndexFile.putKey for every key of every record)."""
    if slot_num <= 0 or index_num < 2:
        return 0
    begin_ts, end_ts, begin_phy, end_phy, slot_count, index_count = _INDEX_HEADER.unpack_from(
        index, 0)
    index_count = max(index_count, 1)
    entries_at = _INDEX_HEADER.size + 4 * slot_num
    done = first
    for done in range(first, count):
        info = infos[done]
        if info.sys_flag & layout.TRANSACTION_TYPE_MASK == layout.TRANSACTION_ROLLBACK:
            continue
        properties = rec.decode_properties(
            bytes(buf[info.props_pos : info.props_pos + info.props_len]))
        keys = [k for k in properties.get(rec.PROPERTY_KEYS, "").split(" ") if k]
        uniq = properties.get(rec.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
        if uniq:
            keys.insert(0, uniq)
        if not keys:
            continue
        room = index_num - index_count
        if len(keys) > room and index_count > 1:
            break
        topic = bytes(buf[info.topic_pos : info.topic_pos + info.topic_len]).decode(
            "utf-8", "replace")
        for key in keys[:room]:
            key_hash = index_key_hash(f"{topic}#{key}")
            slot_at = _INDEX_HEADER.size + 4 * (key_hash % slot_num)
            (previous,) = _INDEX_SLOT.unpack_from(index, slot_at)
            if previous <= 0 or previous > index_count:
                previous = 0
            diff = 0
            if begin_ts > 0:
                diff = min(max(int((info.store_timestamp - begin_ts) / 1000), 0), 2**31 - 1)
            _INDEX_ENTRY.pack_into(index, entries_at + 20 * index_count, key_hash,
                                   info.phys_offset, diff, previous)
            _INDEX_SLOT.pack_into(index, slot_at, index_count)
            if index_count <= 1:
                begin_phy, begin_ts = info.phys_offset, info.store_timestamp
            if previous == 0:
                slot_count += 1
            index_count += 1
            end_phy, end_ts = info.phys_offset, info.store_timestamp
    else:
        done = count
    _INDEX_HEADER.pack_into(index, 0, begin_ts, end_ts, begin_phy, end_phy, slot_count,
                            index_count)
    return done - first


def _java_hash_utf8(data: bytes) -> int:
    return rec.java_string_hash(data.decode("utf-8", "replace"))


_HOST_LENGTHS = (layout.IPV4_HOST_LENGTH, layout.IPV6_HOST_LENGTH)


class PythonEngine:
    """The pure-Python twin of the C engine: the same results, byte for byte, without a
    compiler (and the independent implementation the native tests hold the C code against)."""

    name = "python"

    def handle_for(self, buffer: Buffer) -> Handle:
        return memoryview(buffer)

    def release_handle(self, handle: Handle) -> None:
        handle.release()

    def crc32(self, data: Buffer) -> int:
        return zlib.crc32(data) & layout.CRC_MASK

    def java_hash(self, utf8: bytes) -> int:
        return _java_hash_utf8(utf8)

    def _check(self, topic: bytes, props: bytes, born_host: bytes, store_host: bytes) -> int:
        if (
            len(topic) > layout.MAX_TOPIC_LENGTH
            or len(born_host) not in _HOST_LENGTHS
            or len(store_host) not in _HOST_LENGTHS
        ):
            return ERR_BAD_ARGUMENT
        if len(props) > layout.MAX_PROPERTIES_LENGTH:
            return ERR_PROPS_TOO_LARGE
        return 0

    def encode_record(
        self, handle: Handle, seg_size: int, pos: int, base_offset: int, topic: bytes,
        body: bytes, props: bytes, queue_id: int, flag: int, queue_offset: int, sys_flag: int,
        born_ts: int, born_host: bytes, store_ts: int, store_host: bytes,
        reconsume_times: int, prepared_offset: int,
    ) -> int:
        err = self._check(topic, props, born_host, store_host)
        if err:
            return err
        size = rec.record_size(len(body), len(topic), len(props),
                               born_host_len=len(born_host), store_host_len=len(store_host))
        if size + layout.END_FILE_MIN_BLANK_LENGTH > seg_size - pos:
            return ERR_NO_SPACE
        data = rec.encode_record(
            topic=topic, body=body, properties=props, queue_id=queue_id, flag=flag,
            queue_offset=queue_offset, commitlog_offset=base_offset + pos, sys_flag=sys_flag,
            born_timestamp=born_ts, born_host=born_host, store_timestamp=store_ts,
            store_host=store_host, reconsume_times=reconsume_times,
            prepared_transaction_offset=prepared_offset,
        )
        # As the C engine: the record is valid only once its MAGIC lands, last.
        magic_at, after_magic = layout.MAGIC_AT, layout.MAGIC_AT + 4
        handle[pos : pos + magic_at] = data[:magic_at]
        handle[pos + after_magic : pos + size] = data[after_magic:]
        handle[pos + magic_at : pos + after_magic] = data[magic_at:after_magic]
        return pos + size

    def encode_batch(
        self, handle: Handle, seg_size: int, pos: int, base_offset: int, items: bytes,
        topic: bytes, batch_props: bytes, queue_id: int, first_queue_offset: int,
        sys_flag: int, born_ts: int, born_host: bytes, store_ts: int, store_host: bytes,
        max_body_size: int,
    ) -> tuple[int, list[int]]:
        err = self._check(topic, b"", born_host, store_host)
        if err:
            return err, []
        try:
            decoded = rec.decode_batch(items, max_items=len(items) // MIN_BATCH_ITEM + 1)
        except rec.RecordDecodeError:
            return ERR_BATCH_FORMAT, []
        if not decoded:
            return ERR_BATCH_FORMAT, []
        records: list[tuple[rec.BatchItem, bytes, int]] = []
        separator = rec.PROPERTY_SEPARATOR.encode()
        for i, item in enumerate(decoded):
            if len(item.body) > max_body_size:
                return ERR_BODY_TOO_LARGE, []
            props = item.properties
            if batch_props:
                if props and not props.endswith(separator):
                    props += separator
                props += batch_props
            if len(props) > layout.MAX_PROPERTIES_LENGTH:
                return ERR_PROPS_TOO_LARGE, []
            if props.endswith(b"\0"):  # recovery would take the record for a torn one
                return ERR_BATCH_FORMAT, []
            records.append((item, props, first_queue_offset + i))
        total = sum(
            rec.record_size(len(item.body), len(topic), len(props),
                            born_host_len=len(born_host), store_host_len=len(store_host))
            for item, props, _ in records
        )
        if total + layout.END_FILE_MIN_BLANK_LENGTH > seg_size - pos:
            return ERR_NO_SPACE, []
        entries: list[int] = []
        magic_at, after_magic = layout.MAGIC_AT, layout.MAGIC_AT + 4
        for item, props, queue_offset in records:
            data = rec.encode_record(
                topic=topic, body=item.body, properties=props, queue_id=queue_id,
                flag=item.flag, queue_offset=queue_offset, commitlog_offset=base_offset + pos,
                sys_flag=sys_flag, born_timestamp=born_ts, born_host=born_host,
                store_timestamp=store_ts, store_host=store_host,
            )
            handle[pos : pos + magic_at] = data[:magic_at]
            handle[pos + magic_at : pos + after_magic] = bytes(after_magic - magic_at)
            handle[pos + after_magic : pos + len(data)] = data[after_magic:]
            entries.append(base_offset + pos)
            pos += len(data)
        magic = layout.MAGIC_V1.to_bytes(4, "big")
        for offset in entries:  # publish in order, as the C engine
            at = offset - base_offset
            handle[at + magic_at : at + after_magic] = magic
        return pos, entries

    def scanner(self, capacity: int) -> PythonScanner:
        return PythonScanner(capacity)

    def gatherer(self) -> PythonGatherer:
        return PythonGatherer()

    def decode_records(
        self, buf: bytes, *, max_size: int = rec.MAX_DECODED_RECORD,
        extra_properties: dict[str, str] | None = None,
    ) -> list[rec.StoredMessage]:
        messages = []
        position = 0
        while position < len(buf):
            message = rec.decode_record(buf, position, max_size=max_size,
                                        extra_properties=extra_properties)
            messages.append(message)
            position += message.size
        return messages

    def cq_runs(self, handle: Handle, result: ScanResult) -> CqRuns:
        return _cq_runs_python(handle, result.infos, result.count)

    def index_put(self, index: Handle, slot_num: int, index_num: int, handle: Handle,
                  result: ScanResult, first: int) -> int:
        return _index_put_python(index, slot_num, index_num, handle, result.infos, first,
                                 result.count)

    def msync(self, handle: Handle, start: int, length: int) -> None:
        # The Python engine owns no fd; the caller's segment falls back to os.fdatasync.
        raise NotImplementedError

    def start_sync_thread(self, done_fd: int) -> None:
        return None

    def warm(self, handle: Handle, start: int, length: int) -> None:
        page = 4096
        first = start + (-start % page)  # only pages that begin inside the range
        for p in range(first, start + length, page):
            handle[p] = 0

    def zero(self, handle: Handle, start: int, length: int) -> None:
        chunk = bytes(min(length, 1 << 20))
        end = start + length
        while start < end:
            n = min(len(chunk), end - start)
            handle[start : start + n] = chunk[:n]
            start += n

    def fallocate(self, fd: int, offset: int, length: int) -> None:
        try:
            os.posix_fallocate(fd, offset, length)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise

    def sendfile(self, out_fd: int, in_fd: int, offset: int, count: int) -> int:
        try:
            return os.sendfile(out_fd, in_fd, offset, count)
        except BlockingIOError:
            return -errno.EAGAIN
        except OSError as exc:
            return -(exc.errno or errno.EIO)

    def splice_to_file(self, sock_fd: int, pipe: tuple[int, int], file_fd: int, offset: int,
                       count: int) -> int:
        splice = getattr(os, "splice", None)
        if splice is None:  # not Linux
            return -errno.ENOSYS
        pipe_r, pipe_w = pipe
        moved = 0
        while moved < count:
            try:
                taken = splice(sock_fd, pipe_w, count - moved,
                               flags=os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK)
            except OSError as exc:
                if moved:
                    break  # report the bytes moved; the next call meets the condition again
                return -(exc.errno or errno.EIO)
            if taken == 0:
                break  # the peer closed
            left = taken
            while left:
                at = offset + moved
                try:
                    put = splice(pipe_r, file_fd, left, offset_dst=at, flags=os.SPLICE_F_MOVE)
                except OSError:
                    put = 0
                if put <= 0:  # a file that takes no splice: copy what is in the pipe
                    try:
                        _copy_from_pipe(pipe_r, file_fd, at, left)
                    except OSError as exc:
                        return -(exc.errno or errno.EIO)
                    put = left
                moved += put
                left -= put
        return moved


def _copy_from_pipe(pipe_r: int, file_fd: int, offset: int, length: int) -> None:
    """``length`` bytes from the pipe into the file at ``offset`` (splice_to_file's copy)."""
    while length:
        try:
            data = os.read(pipe_r, min(length, 1 << 16))
        except BlockingIOError:
            data = b""
        if not data:
            raise OSError(errno.EIO, "the pipe held fewer bytes than were spliced into it")
        view = memoryview(data)
        while view:
            put = os.pwrite(file_fd, view, offset)
            if put <= 0:  # as the native copy: never a loop that writes nothing
                raise OSError(errno.EIO, "the file took no bytes of a write")
            view = view[put:]
            offset += put
        length -= len(data)


_PROBLEMS = (GATHER_REMOVED, GATHER_ABSENT, GATHER_INVALID)


class PythonGatherer:
    """th_gather in Python: the same outcomes, records and spans as NativeGatherer."""

    def gather(self, handle: Handle, seg_size: int, base_offset: int, min_offset: int,
               readable_end: int, entries: Buffer, tag_codes: Sequence[int] | None,
               topic: bytes, queue_id: int, first_queue_offset: int, flags: int,
               max_record: int, max_count: int, max_bytes: int, bytes_before: int = 0
               ) -> GatherResult:
        wanted = None if tag_codes is None else set(tag_codes)
        outcomes = bytearray()
        records: list[tuple[int, int]] = []
        spans: list[tuple[int, int]] = []
        total, last_phys, problems, last_problem, stop = 0, -1, 0, 0, GATHER_END
        for i, (phys, size, tags) in enumerate(layout.CQ_ENTRY.iter_unpack(entries)):
            if len(records) >= max_count:
                stop = GATHER_COUNT
                break
            if size == layout.CQ_BLANK_SIZE or phys < min_offset:
                outcome = GATHER_REMOVED
            elif wanted is not None and tags not in wanted:
                outcome = GATHER_FILTERED
            else:
                if (records or bytes_before) and size > 0 \
                        and bytes_before + total + size > max_bytes:
                    stop = GATHER_BYTES
                    break
                if not base_offset <= phys < base_offset + seg_size:
                    stop = GATHER_SEGMENT
                    break
                at = phys - base_offset
                if size <= 0 or phys + 8 > readable_end or phys + size > readable_end \
                        or size > seg_size - at:
                    outcome = GATHER_ABSENT
                elif flags & GATHER_VERIFY and not _serves(
                        handle[at : at + size], phys, max_record,
                        (topic, queue_id, first_queue_offset + i)):
                    outcome = GATHER_INVALID
                else:
                    outcome = GATHER_FOUND
                    records.append((at, size))
                    if spans and sum(spans[-1]) == at:
                        spans[-1] = (spans[-1][0], spans[-1][1] + size)
                    else:
                        spans.append((at, size))
                    total += size
                    last_phys = phys
            outcomes.append(outcome)
            if outcome in _PROBLEMS:
                problems += 1
                last_problem = outcome
        return GatherResult(len(outcomes), len(records), stop, total, last_phys, problems,
                            last_problem, spans, records, bytes(outcomes))


def _serves(record: memoryview, phys: int, max_record: int,
            expect: tuple[bytes, int, int]) -> bool:
    """The check of GATHER_VERIFY for one record (the whole of ``record``)."""
    if not rec.record_size(0, 0, 0) <= len(record) <= max_record:
        return False
    try:
        message = rec.decode_record(record, check_crc=True, max_size=max_record)
    except rec.RecordDecodeError:
        return False
    info = PythonScanner._parse(record, 0, len(record), _magic(record), phys, 0)
    if info is None or _torn(record, info):
        return False
    return (message.size == len(record) and message.commitlog_offset == phys
            and (message.topic.encode(), message.queue_id, message.queue_offset) == expect)


def _magic(record: memoryview) -> int:
    return layout.RECORD_START.unpack_from(record, 0)[1]


def _torn(buf: Handle, info: RecordInfo) -> bool:
    """th_scan's torn-record test: a whole record never ends in a 0 byte (its properties'
    last, or its topic's when it has no properties)."""
    if info.props_len:
        return buf[info.props_pos + info.props_len - 1] == 0
    return bool(info.topic_len) and buf[info.topic_pos + info.topic_len - 1] == 0


class PythonScanner:
    """th_scan in Python: the same stops, sizes and record fields as NativeScanner."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity

    def scan(self, handle: Handle, limit: int, pos: int, base_offset: int, flags: int,
             max_record: int) -> ScanResult:
        infos: list[RecordInfo] = []
        while True:
            if pos == limit:
                return ScanResult(len(infos), pos, STOP_END, 0, infos)
            if len(infos) >= self._capacity:
                return ScanResult(len(infos), pos, STOP_FULL, 0, infos)
            if limit - pos < 8:
                return ScanResult(len(infos), pos, STOP_PARTIAL, 0, infos)
            size, magic = layout.RECORD_START.unpack_from(handle, pos)
            if magic == layout.BLANK_MAGIC:
                return ScanResult(len(infos), pos, STOP_BLANK, size, infos)
            if magic not in (layout.MAGIC_V1, layout.MAGIC_V2):
                return ScanResult(len(infos), pos, STOP_BAD_MAGIC, size, infos)
            if size < rec.record_size(0, 0, 0) or size > max_record:
                return ScanResult(len(infos), pos, STOP_BAD_SIZE, size, infos)
            if pos + size > limit:
                return ScanResult(len(infos), pos, STOP_PARTIAL, size, infos)
            info = self._parse(handle, pos, size, magic, base_offset, flags)
            if info is None:
                return ScanResult(len(infos), pos, STOP_BAD_SIZE, size, infos)
            if _torn(handle, info):
                return ScanResult(len(infos), pos, STOP_TORN, size, infos)
            if info.crc_ok == 0:
                return ScanResult(len(infos), pos, STOP_BAD_CRC, size, infos)
            infos.append(info)
            pos += size

    @staticmethod
    def _parse(
        buf: Handle, pos: int, size: int, magic: int, base_offset: int, flags: int
    ) -> RecordInfo | None:
        """Walk one record's declared lengths (the order of wire/layout.py's diagram), each
        checked against TOTALSIZE; None when they do not add up."""
        i = RecordInfo()
        (i.size, _, i.body_crc, i.queue_id, i.flag, i.queue_offset, _phys, i.sys_flag,
         i.born_timestamp) = layout.HEAD.unpack_from(buf, pos)
        end = pos + size
        p = pos + layout.HEAD.size
        i.born_host_len = layout.born_host_length(i.sys_flag)
        i.store_host_len = layout.store_host_length(i.sys_flag)
        i.born_host_pos = p
        p += i.born_host_len
        if p + 8 + i.store_host_len + 16 > end:
            return None
        (i.store_timestamp,) = layout.INT64.unpack_from(buf, p)
        p += 8
        i.store_host_pos = p
        p += i.store_host_len
        (i.reconsume_times,) = layout.INT32.unpack_from(buf, p)
        (i.prepared_tx_offset,) = layout.INT64.unpack_from(buf, p + 4)
        (body_len,) = layout.INT32.unpack_from(buf, p + 12)
        p += 16
        if body_len < 0 or p + body_len > end:
            return None
        i.body_pos, i.body_len = p, body_len
        p += body_len
        i.version = 1 if magic == layout.MAGIC_V1 else 2
        if i.version == 1:
            if p + 1 > end:
                return None
            topic_len = buf[p]
            p += 1
        else:
            if p + 2 > end:
                return None
            (topic_len,) = layout.UINT16.unpack_from(buf, p)
            p += 2
        i.topic_pos, i.topic_len = p, topic_len
        p += topic_len
        if p + 2 > end:
            return None
        (props_len,) = layout.UINT16.unpack_from(buf, p)
        p += 2
        i.props_pos, i.props_len = p, props_len
        p += props_len
        if p != end:
            return None
        i.phys_offset = base_offset + pos
        i.tags_code = 0
        if flags & SCAN_TAGS and props_len:
            tags = rec.decode_properties(bytes(buf[i.props_pos : i.props_pos + props_len])).get(
                rec.PROPERTY_TAGS
            )
            if tags:
                i.tags_code = rec.java_string_hash(tags)
        if flags & SCAN_CHECK_CRC:
            crc = zlib.crc32(buf[i.body_pos : i.body_pos + body_len]) & layout.CRC_MASK
            i.crc_ok = 1 if crc == i.body_crc else 0
        else:
            i.crc_ok = 2
        return i


#: the engine this process uses (see ``native_backend``)
engine: RecordEngine = NativeEngine(native_module) if native_module is not None else PythonEngine()
#: the Python twin, always available (the native tests compare against it)
python_engine: RecordEngine = PythonEngine()
