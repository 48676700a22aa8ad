"""The record engine: the native cffi module when it is built, a pure-Python twin otherwise.

Why two: the C module (native/, built as ``trio_ha._native``) encodes straight into a
segment's mmap, scans and CRCs records without per-byte Python work and with the GIL released.
The Python twin exists so the package still works where no compiler is available, and so the
tests can hold the C code against an independent implementation. ``native_backend`` says which
one loaded; with ``TRIO_HA_REQUIRE_NATIVE=1`` (as CI runs) a missing or stale native module is
an import error, never a silent fallback.

Both engines share one interface. Buffers are *handles* made once per mapping by
``handle_for(buffer)``: a cffi pointer for the native engine, a memoryview for Python.
"""

from __future__ import annotations

import errno
import os
import struct
import zlib

from .wire import record as rec

__all__ = [
    "NATIVE_VERSION", "native_backend", "ERR_NO_SPACE", "ERR_BAD_ARGUMENT",
    "ERR_BATCH_FORMAT", "ERR_BODY_TOO_LARGE", "ERR_PROPS_TOO_LARGE", "ERR_TOO_MANY",
    "STOP_END", "STOP_PARTIAL", "STOP_BLANK", "STOP_FULL", "STOP_BAD_MAGIC", "STOP_BAD_SIZE",
    "STOP_BAD_CRC", "SCAN_CHECK_CRC", "SCAN_TAGS",
]

# Must equal TH_NATIVE_VERSION in native/trio_ha_native.h.
NATIVE_VERSION = 2

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
STOP_NAMES = {
    STOP_END: "end", STOP_PARTIAL: "partial record", STOP_BLANK: "blank record",
    STOP_FULL: "output full", STOP_BAD_MAGIC: "bad magic", STOP_BAD_SIZE: "bad size",
    STOP_BAD_CRC: "body CRC mismatch",
}

#: the smallest SEND_BATCH_MESSAGE item: 20 bytes of header and body length, 2 of props length
MIN_BATCH_ITEM = 22

SCAN_CHECK_CRC = 1
SCAN_TAGS = 2


class NativeModuleError(ImportError):
    """The native module is required (TRIO_HA_REQUIRE_NATIVE=1) but missing or stale."""


def _load_native():
    try:
        from . import _native  # type: ignore[attr-defined]
    except ImportError as exc:
        return None, f"not built ({exc})"
    found = _native.lib.th_version()
    if found != NATIVE_VERSION:
        return None, f"stale build: C version {found}, Python expects {NATIVE_VERSION}"
    return _native, None


_native, _why_not_native = _load_native()
if _native is None and os.environ.get("TRIO_HA_REQUIRE_NATIVE") == "1":
    raise NativeModuleError(
        f"TRIO_HA_REQUIRE_NATIVE=1 but trio_ha._native is unusable: {_why_not_native}; "
        "reinstall the package (pip install -e .) with a C compiler and zlib headers"
    )

#: "native" or "python": which record engine this process uses.
native_backend = "native" if _native is not None else "python"


class ScanResult:
    """Where a scan stopped and why; ``infos[:count]`` describe the records it passed."""

    __slots__ = ("count", "end", "stop", "size", "infos")

    def __init__(self, count: int, end: int, stop: int, size: int, infos) -> None:
        self.count = count
        self.end = end
        self.stop = stop
        self.size = size
        self.infos = infos

    @property
    def reason(self) -> str:
        return STOP_NAMES.get(self.stop, f"stop {self.stop}")


# ---- the native engine ---------------------------------------------------------------------


class _NativeEngine:
    name = "native"

    def __init__(self, module) -> None:
        self.ffi = module.ffi
        self.lib = module.lib
        self._batch_capacity = 0
        self._batch_out = None
        self._batch_count = self.ffi.new("size_t *")
        self._runs_capacity = 0
        self._runs = None
        self._entries = None

    def handle_for(self, buffer):
        return self.ffi.from_buffer(buffer, require_writable=False)

    def crc32(self, data) -> int:
        return self.lib.th_crc32(self.ffi.from_buffer(data), len(data))

    def java_hash(self, utf8: bytes) -> int:
        return self.lib.th_java_hash(utf8, len(utf8))

    def encode_record(self, handle, seg_size, pos, base_offset, topic, body, props, queue_id,
                      flag, queue_offset, sys_flag, born_ts, born_host, store_ts, store_host,
                      reconsume_times, prepared_offset) -> int:
        return self.lib.th_encode_record(
            handle, seg_size, pos, base_offset, topic, len(topic), body, len(body), props,
            len(props), queue_id, flag, queue_offset, sys_flag, born_ts, born_host,
            len(born_host), store_ts, store_host, len(store_host), reconsume_times,
            prepared_offset,
        )

    def encode_batch(self, handle, seg_size, pos, base_offset, items, topic, batch_props,
                     queue_id, first_queue_offset, sys_flag, born_ts, born_host, store_ts,
                     store_host, max_body_size):
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
        return result, [out[i].phys_offset for i in range(count[0])]

    def scanner(self, capacity: int) -> "_NativeScanner":
        return _NativeScanner(self, capacity)

    def cq_runs(self, handle, result: ScanResult):
        """Group a scan's records into consume-queue runs: ([(first, count)], entries) where
        entries[20*i:20*i+20] is record i's consume-queue entry."""
        if not hasattr(self.lib, "th_cq_runs"):
            return _cq_runs_python(self.ffi.buffer(handle, result.end), result.infos, result.count)
        count = result.count
        if count == 0:  # nothing allocated yet on a first empty scan; ffi.buffer(NULL) raises
            return [], b""
        if count > self._runs_capacity:
            self._runs = self.ffi.new("th_cq_run[]", count)
            self._entries = self.ffi.new("uint8_t[]", count * 20)
            self._runs_capacity = count
        n = self.lib.th_cq_runs(handle, result.infos, count, self._entries, self._runs, count)
        runs = self._runs
        return [(runs[i].first, runs[i].count) for i in range(n)], self.ffi.buffer(self._entries, count * 20)

    def msync(self, handle, start: int, length: int) -> None:
        rc = self.lib.th_msync(handle + start, length)
        if rc < 0:
            raise OSError(-rc, f"msync: {os.strerror(-rc)}")

    def warm(self, handle, start: int, length: int) -> None:
        rc = self.lib.th_warm(handle + start, length)
        if rc < 0:
            raise OSError(-rc, f"warming a segment: {os.strerror(-rc)}")

    def zero(self, handle, start: int, length: int) -> None:
        self.lib.th_zero(handle + start, length)

    def fallocate(self, fd: int, offset: int, length: int) -> None:
        rc = self.lib.th_fallocate(fd, offset, length)
        if rc not in (0, errno.EOPNOTSUPP, errno.EINVAL):
            raise OSError(rc, f"fallocate: {os.strerror(rc)}")


class _NativeScanner:
    def __init__(self, engine: _NativeEngine, capacity: int) -> None:
        self._lib = engine.lib
        self._capacity = capacity
        self._out = engine.ffi.new("th_record_info[]", capacity)
        self._res = engine.ffi.new("th_scan_result *")

    def scan(self, handle, limit: int, pos: int, base_offset: int, flags: int,
             max_record: int) -> ScanResult:
        n = self._lib.th_scan(handle, limit, pos, base_offset, flags, max_record, self._out,
                              self._capacity, self._res)
        res = self._res
        return ScanResult(n, res.end, res.stop, res.size, self._out)


# ---- the Python engine ----------------------------------------------------------------------

_HEAD = struct.Struct(">iIiiiqqiq")
_Q = struct.Struct(">q")
_I = struct.Struct(">i")
_H = struct.Struct(">H")
_BLANK = struct.Struct(">iI")


class RecordInfo:
    """The Python engine's th_record_info."""

    __slots__ = (
        "phys_offset", "queue_offset", "born_timestamp", "store_timestamp",
        "prepared_tx_offset", "tags_code", "size", "queue_id", "flag", "sys_flag", "body_crc",
        "reconsume_times", "born_host_pos", "store_host_pos", "body_pos", "body_len",
        "topic_pos", "props_pos", "topic_len", "props_len", "born_host_len", "store_host_len",
        "version", "crc_ok",
    )


_CQ_ENTRY = struct.Struct(">qiq")


def _cq_runs_python(buf, infos, count: int) -> tuple[list[tuple[int, int]], bytes]:
    """The consume-queue runs of scanned records (see th_cq_runs in the C header): records
    that go to one queue with consecutive queue offsets, and the 20-byte entry of each."""
    runs: list[tuple[int, int]] = []
    entries = bytearray(count * 20)
    previous = None  # (topic bytes, queue id, next queue offset) of the open run
    for i in range(count):
        info = infos[i]
        tx_type = info.sys_flag & rec.TRANSACTION_TYPE_MASK
        if tx_type == rec.TRANSACTION_PREPARED or tx_type == rec.TRANSACTION_ROLLBACK:
            previous = None
            continue
        topic = bytes(buf[info.topic_pos : info.topic_pos + info.topic_len])
        _CQ_ENTRY.pack_into(entries, i * 20, info.phys_offset, info.size, info.tags_code)
        if previous == (topic, info.queue_id, info.queue_offset):
            first, n = runs[-1]
            runs[-1] = (first, n + 1)
        else:
            runs.append((i, 1))
        previous = (topic, info.queue_id, info.queue_offset + 1)
    return runs, bytes(entries)


def _java_hash_utf8(data: bytes) -> int:
    return rec.java_string_hash(data.decode("utf-8", "replace"))


class _PythonEngine:
    name = "python"

    def handle_for(self, buffer):
        return memoryview(buffer)

    def crc32(self, data) -> int:
        return zlib.crc32(data) & 0x7FFFFFFF

    def java_hash(self, utf8: bytes) -> int:
        return _java_hash_utf8(utf8)

    def _check(self, topic, props, born_host, store_host) -> int:
        if len(topic) > rec.MAX_TOPIC_LENGTH or len(born_host) not in (8, 20) or len(
            store_host
        ) not in (8, 20):
            return ERR_BAD_ARGUMENT
        if len(props) > rec.MAX_PROPERTIES_LENGTH:
            return ERR_PROPS_TOO_LARGE
        return 0

    def encode_record(self, handle, seg_size, pos, base_offset, topic, body, props, queue_id,
                      flag, queue_offset, sys_flag, born_ts, born_host, store_ts, store_host,
                      reconsume_times, prepared_offset) -> int:
        err = self._check(topic, props, born_host, store_host)
        if err:
            return err
        size = rec.record_size(len(body), len(topic), len(props),
                               born_host_len=len(born_host), store_host_len=len(store_host))
        if size + rec.END_FILE_MIN_BLANK_LENGTH > seg_size - pos:
            return ERR_NO_SPACE
        data = rec.encode_record(
            topic=topic, body=body, properties=props, queue_id=queue_id, flag=flag,
            queue_offset=queue_offset, commitlog_offset=base_offset + pos, sys_flag=sys_flag,
            born_timestamp=born_ts, born_host=born_host, store_timestamp=store_ts,
            store_host=store_host, reconsume_times=reconsume_times,
            prepared_transaction_offset=prepared_offset,
        )
        # As the C engine: the record is valid only once its MAGIC lands, last.
        handle[pos : pos + 4] = data[:4]
        handle[pos + 8 : pos + size] = data[8:]
        handle[pos + 4 : pos + 8] = data[4:8]
        return pos + size

    def encode_batch(self, handle, seg_size, pos, base_offset, items, topic, batch_props,
                     queue_id, first_queue_offset, sys_flag, born_ts, born_host, store_ts,
                     store_host, max_body_size):
        err = self._check(topic, b"", born_host, store_host)
        if err:
            return err, []
        try:
            decoded = rec.decode_batch(items, max_items=len(items) // MIN_BATCH_ITEM + 1)
        except rec.RecordDecodeError:
            return ERR_BATCH_FORMAT, []
        if not decoded:
            return ERR_BATCH_FORMAT, []
        records = []
        for i, item in enumerate(decoded):
            if len(item.body) > max_body_size:
                return ERR_BODY_TOO_LARGE, []
            props = item.properties
            if batch_props:
                if props and not props.endswith(b"\x02"):
                    props += b"\x02"
                props += batch_props
            if len(props) > rec.MAX_PROPERTIES_LENGTH:
                return ERR_PROPS_TOO_LARGE, []
            records.append((item, props, first_queue_offset + i))
        total = sum(
            rec.record_size(len(item.body), len(topic), len(props),
                            born_host_len=len(born_host), store_host_len=len(store_host))
            for item, props, _ in records
        )
        if total + rec.END_FILE_MIN_BLANK_LENGTH > seg_size - pos:
            return ERR_NO_SPACE, []
        entries = []
        for item, props, queue_offset in records:
            data = rec.encode_record(
                topic=topic, body=item.body, properties=props, queue_id=queue_id,
                flag=item.flag, queue_offset=queue_offset, commitlog_offset=base_offset + pos,
                sys_flag=sys_flag, born_timestamp=born_ts, born_host=born_host,
                store_timestamp=store_ts, store_host=store_host,
            )
            handle[pos : pos + 4] = data[:4]
            handle[pos + 4 : pos + 8] = b"\0\0\0\0"
            handle[pos + 8 : pos + len(data)] = data[8:]
            entries.append(base_offset + pos)
            pos += len(data)
        for offset in entries:  # publish in order, as the C engine
            at = offset - base_offset
            handle[at + 4 : at + 8] = rec.MAGIC_V1.to_bytes(4, "big")
        return pos, entries

    def scanner(self, capacity: int) -> "_PythonScanner":
        return _PythonScanner(capacity)

    def cq_runs(self, handle, result: ScanResult):
        return _cq_runs_python(handle, result.infos, result.count)

    def msync(self, handle, start: int, length: int) -> None:
        # The Python engine owns no fd; the caller's segment falls back to os.fdatasync.
        raise NotImplementedError

    def warm(self, handle, start: int, length: int) -> None:
        page = 4096
        first = start + (-start % page)  # only pages that begin inside the range
        for p in range(first, start + length, page):
            handle[p] = 0

    def zero(self, handle, start: int, length: int) -> None:
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


class _PythonScanner:
    def __init__(self, capacity: int) -> None:
        self._capacity = capacity

    def scan(self, buf, limit: int, pos: int, base_offset: int, flags: int,
             max_record: int) -> ScanResult:
        infos: list[RecordInfo] = []
        while True:
            if pos == limit:
                return ScanResult(len(infos), pos, STOP_END, 0, infos)
            if len(infos) >= self._capacity:
                return ScanResult(len(infos), pos, STOP_FULL, 0, infos)
            if limit - pos < 8:
                return ScanResult(len(infos), pos, STOP_PARTIAL, 0, infos)
            size, magic = _BLANK.unpack_from(buf, pos)
            if magic == rec.BLANK_MAGIC:
                return ScanResult(len(infos), pos, STOP_BLANK, size, infos)
            if magic not in (rec.MAGIC_V1, rec.MAGIC_V2):
                return ScanResult(len(infos), pos, STOP_BAD_MAGIC, size, infos)
            if size < rec.record_size(0, 0, 0) or size > max_record:
                return ScanResult(len(infos), pos, STOP_BAD_SIZE, size, infos)
            if pos + size > limit:
                return ScanResult(len(infos), pos, STOP_PARTIAL, size, infos)
            info = self._parse(buf, pos, size, magic, base_offset, flags)
            if info is None:
                return ScanResult(len(infos), pos, STOP_BAD_SIZE, size, infos)
            if info.crc_ok == 0:
                return ScanResult(len(infos), pos, STOP_BAD_CRC, size, infos)
            infos.append(info)
            pos += size

    @staticmethod
    def _parse(buf, pos, size, magic, base_offset, flags) -> RecordInfo | None:
        i = RecordInfo()
        (i.size, _, i.body_crc, i.queue_id, i.flag, i.queue_offset, _phys, i.sys_flag,
         i.born_timestamp) = _HEAD.unpack_from(buf, pos)
        end = pos + size
        p = pos + _HEAD.size
        i.born_host_len = 20 if i.sys_flag & rec.SYSFLAG_BORNHOST_V6 else 8
        i.store_host_len = 20 if i.sys_flag & rec.SYSFLAG_STOREHOST_V6 else 8
        i.born_host_pos = p
        p += i.born_host_len
        if p + 8 + i.store_host_len + 16 > end:
            return None
        (i.store_timestamp,) = _Q.unpack_from(buf, p)
        p += 8
        i.store_host_pos = p
        p += i.store_host_len
        (i.reconsume_times,) = _I.unpack_from(buf, p)
        (i.prepared_tx_offset,) = _Q.unpack_from(buf, p + 4)
        (body_len,) = _I.unpack_from(buf, p + 12)
        p += 16
        if body_len < 0 or p + body_len > end:
            return None
        i.body_pos, i.body_len = p, body_len
        p += body_len
        i.version = 1 if magic == rec.MAGIC_V1 else 2
        if i.version == 1:
            if p + 1 > end:
                return None
            topic_len = buf[p]
            p += 1
        else:
            if p + 2 > end:
                return None
            (topic_len,) = _H.unpack_from(buf, p)
            p += 2
        i.topic_pos, i.topic_len = p, topic_len
        p += topic_len
        if p + 2 > end:
            return None
        (props_len,) = _H.unpack_from(buf, p)
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
            crc = zlib.crc32(buf[i.body_pos : i.body_pos + body_len]) & 0x7FFFFFFF
            i.crc_ok = 1 if crc == i.body_crc else 0
        else:
            i.crc_ok = 2
        return i


engine = _NativeEngine(_native) if _native is not None else _PythonEngine()
python_engine = _PythonEngine()
