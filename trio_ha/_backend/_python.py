"""The Python engine: the pure-Python twin of the C core, the same results byte for byte.

It exists so the package still works where no compiler is available, and so the tests can hold
the C code against an independent implementation: it is meant to be read beside native/*.c,
each function naming the C call it mirrors. Where it reads or writes stored bytes by position
it takes the positions from ``wire.layout``, as the C code mirrors them.
"""

from __future__ import annotations

import errno
import os
import struct
import zlib
from collections.abc import Sequence

from ..wire import layout
from ..wire import record as rec
from ._protocol import (
    ERR_BAD_ARGUMENT,
    ERR_BATCH_FORMAT,
    ERR_BODY_TOO_LARGE,
    ERR_NO_SPACE,
    ERR_PROPS_TOO_LARGE,
    GATHER_ABSENT,
    GATHER_BYTES,
    GATHER_COUNT,
    GATHER_END,
    GATHER_FILTERED,
    GATHER_FOUND,
    GATHER_INVALID,
    GATHER_REMOVED,
    GATHER_SEGMENT,
    GATHER_VERIFY,
    MIN_BATCH_ITEM,
    SCAN_CHECK_CRC,
    SCAN_TAGS,
    STOP_BAD_CRC,
    STOP_BAD_MAGIC,
    STOP_BAD_SIZE,
    STOP_BLANK,
    STOP_END,
    STOP_FULL,
    STOP_PARTIAL,
    STOP_TORN,
    Buffer,
    CqRuns,
    GatherResult,
    Handle,
    RecordInfo,
    ScanResult,
)


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

