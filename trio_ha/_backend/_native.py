"""The native engine: ``RecordEngine`` over the cffi module ``trio_ha._native`` (native/).

Each call is one C call per record or per batch, and cffi releases the GIL around it. The
Python side of a call only passes buffers and reads the results out: output arrays are
allocated once and reused, and results are read in bulk (struct, memoryview casts) rather than
one cffi read per field, since those reads cost more than the C call itself.
"""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Iterable, Sequence
from types import ModuleType
from typing import Any

from ..wire import layout
from ..wire import record as rec
from ._protocol import (
    MIN_BATCH_ITEM,
    STOP_END,
    STOP_NAMES,
    Buffer,
    CqRuns,
    GatherResult,
    Handle,
    ScanResult,
)
from ._sync_thread import NativeSyncThread

_SPAN = struct.Struct("=QQ")


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
        # (a cffi read per entry costs five times as much).
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


def _cq_table_size(count: int) -> int:
    """th_cq_runs's scratch table for ``count`` records: a power of two, at least twice it."""
    return 2 << (count - 1).bit_length()

