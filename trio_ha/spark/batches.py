"""Executor side: read a planned chunk of a segment into Arrow record batches, column-wise.

The native scanner describes up to ``batch_rows`` records per call as an array of
``th_record_info`` structs (positions into the mapped segment, no copies). That array is
viewed as a numpy structured array, so fixed-width columns are plain field copies. Variable
-width fields (topic, body, properties) are gathered by building one Arrow binary array whose
offsets interleave each field's start and end — ``[s0, e0, s1, e1, ...]`` over the mapped
segment, zero-copy — and taking every other element: Arrow copies just the field bytes, in C.
Properties are split into the map and the TAGS / KEYS / UNIQ_KEY columns with Arrow compute
kernels over the whole batch. No Python code runs per row.

This module needs numpy and pyarrow but not Spark: :func:`read_chunk` also serves
:func:`trio_ha.spark.read_arrow` for use without a Spark session.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import _backend
from ..wire import layout
from ..wire import record as rec
from .plan import Chunk, ReadOptions
from .store_files import CorruptRecordError, MappedSegment, Segment, StoreError, infos_to_numpy

__all__ = ["ARROW_SCHEMA", "read_chunk", "SCHEMA_DDL", "COLUMNS"]

_TS = pa.timestamp("us", tz="UTC")
_KEYS_TYPE = pa.list_(pa.field("element", pa.string(), nullable=False))
_MAP_TYPE = pa.map_(pa.field("key", pa.string(), nullable=False),
                    pa.field("value", pa.string(), nullable=False))

#: (name, Arrow type, nullable, Spark DDL type, description) — the stable schema
COLUMNS = [
    ("topic", pa.string(), False, "STRING", "topic name"),
    ("queue_id", pa.int32(), False, "INT", "consume-queue id within the topic"),
    ("queue_offset", pa.int64(), False, "BIGINT", "logical offset in the consume queue"),
    ("commitlog_offset", pa.int64(), False, "BIGINT", "byte offset of the record in the commitlog"),
    ("size", pa.int32(), False, "INT", "TOTALSIZE of the record in bytes"),
    ("body", pa.binary(), True, "BINARY", "message body (null when include_body=false)"),
    ("body_crc", pa.int32(), False, "INT", "BODYCRC as stored (CRC-32 masked to 31 bits)"),
    ("crc_ok", pa.bool_(), True, "BOOLEAN",
     "body CRC verified: true, false (only with on_corrupt=emit), null when verify_crc=false"),
    ("tags", pa.string(), True, "STRING", "TAGS property, null when absent"),
    ("keys", _KEYS_TYPE, False, "ARRAY<STRING NOT NULL>",
     "KEYS property split on spaces (empty when absent)"),
    ("uniq_key", pa.string(), True, "STRING", "UNIQ_KEY property (the client's msgId)"),
    ("properties", _MAP_TYPE, False, "MAP<STRING, STRING NOT NULL>",
     "all properties, parsed as RocketMQ does (both separator styles)"),
    ("flag", pa.int32(), False, "INT", "producer flag"),
    ("sys_flag", pa.int32(), False, "INT", "SYSFLAG bits"),
    ("born_timestamp", _TS, False, "TIMESTAMP", "producer time"),
    ("store_timestamp", _TS, False, "TIMESTAMP", "broker store time"),
    ("born_host", pa.string(), False, "STRING", "producer address ip:port"),
    ("store_host", pa.string(), False, "STRING", "broker address ip:port"),
    ("reconsume_times", pa.int32(), False, "INT", "retry count"),
    ("prepared_transaction_offset", pa.int64(), False, "BIGINT",
     "commitlog offset of the half message (transactions), else 0"),
    ("msg_id", pa.string(), False, "STRING", "offsetMsgId: hex(store host + commitlog offset)"),
    ("store_dir", pa.string(), False, "STRING", "the store directory the record was read from"),
]

ARROW_SCHEMA = pa.schema([pa.field(n, t, nullable=nl) for n, t, nl, _, _ in COLUMNS])
SCHEMA_DDL = ", ".join(f"{n} {ddl}{'' if nl else ' NOT NULL'}" for n, _, nl, ddl, _ in COLUMNS)

_HEX = np.frombuffer(b"0123456789ABCDEF", np.uint8)
_EMPTY_STRINGS = pa.array([], pa.string())

#: how many bytes of a segment one scan call may cover (bounds a batch's memory)
BATCH_BYTES = 32 << 20


def _repeat_string(value: str, n: int) -> pa.Array:
    raw = value.encode()
    offsets = np.arange(0, (n + 1) * len(raw), len(raw) or 1, dtype=np.int32)[: n + 1]
    if not raw:
        offsets = np.zeros(n + 1, np.int32)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets),
                                                  pa.py_buffer(raw * n)])


def _gather(buf: pa.Buffer, starts: np.ndarray, lens: np.ndarray, typ: pa.DataType) -> pa.Array:
    """The byte fields ``buf[starts[i] : starts[i] + lens[i]]`` (in increasing, non
    overlapping order) as one compact Arrow array."""
    n = len(starts)
    if n == 0:
        return pa.array([], typ)
    offs = np.empty(2 * n, np.int32)
    offs[0::2] = starts
    offs[1::2] = starts + lens
    spread = pa.Array.from_buffers(typ, 2 * n - 1, [None, pa.py_buffer(offs), buf])
    return spread.take(pa.array(np.arange(0, 2 * n - 1, 2, dtype=np.int32)))


def _scatter(values: pa.Array, rows: np.ndarray, which: np.ndarray, n: int) -> pa.Array:
    """A length-``n`` array: ``values[which[j]]`` at row ``rows[which[j]]``, null elsewhere
    (the last one wins where a row has several)."""
    pos = np.full(n, -1, np.int64)
    pos[rows[which]] = which
    return values.take(pa.array(pos, mask=pos < 0))


def _list_from_parts(values: pa.Array, rows: np.ndarray, n: int, typ: pa.DataType) -> pa.Array:
    counts = np.bincount(rows, minlength=n) if len(rows) else np.zeros(n, np.int64)
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), values, type=typ)


def _ranges_split(
    data: np.ndarray, starts: np.ndarray, ends: np.ndarray, byte: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split the disjoint, ordered byte ranges [starts[i], ends[i]) of ``data`` at every
    ``byte``: (piece starts, piece ends, index of the range each piece came from)."""
    if not len(starts):
        empty = np.empty(0, np.int64)
        return empty, empty, empty
    lo, hi = int(starts[0]), int(ends[-1])
    seps = np.flatnonzero(data[lo:hi] == byte).astype(np.int64) + lo
    if len(seps):
        owner = np.searchsorted(starts, seps, side="right") - 1
        inside = seps < ends[owner]
        seps = seps[inside]
    piece_starts = np.sort(np.concatenate([starts, seps + 1]))
    piece_ends = np.sort(np.concatenate([seps, ends]))
    owner = np.searchsorted(starts, piece_starts, side="right") - 1
    return piece_starts, piece_ends, owner


def _named(data: np.ndarray, key_s: np.ndarray, key_len: np.ndarray, name: bytes) -> np.ndarray:
    """Indices of the keys equal to ``name``."""
    cand = np.flatnonzero(key_len == len(name))
    for j, byte in enumerate(name):
        if not len(cand):
            break
        cand = cand[data[key_s[cand] + j] == byte]
    return cand


_PROPERTY_SEPARATOR = ord(rec.PROPERTY_SEPARATOR)
_NAME_VALUE_SEPARATOR = ord(rec.NAME_VALUE_SEPARATOR)
_KEY_SEPARATOR = ord(" ")  # KEYS holds several keys, space-separated


def parse_properties(props: pa.Array) -> tuple[pa.Array, pa.Array, pa.Array, pa.Array]:
    """RocketMQ properties text -> (map, tags, keys list, uniq_key), for a whole batch.

    As MessageDecoder.string2messageProperties: split on \\x02, split each part at its first
    \\x01, drop pairs with an empty name or value (so both trailing-separator styles work).
    Works on the bytes: separator positions by numpy, fields gathered by Arrow."""
    n = len(props)
    props = props.cast(pa.string()) if props.type != pa.string() else props
    if props.offset:
        props = pa.concat_arrays([props])  # a compact copy with offset 0
    bufs = props.buffers()
    offsets = np.frombuffer(bufs[1], np.int32, n + 1).astype(np.int64)
    data_buf = bufs[2] if bufs[2] is not None else pa.py_buffer(b"")
    data = np.frombuffer(data_buf, np.uint8)
    rows_nonempty = np.flatnonzero(offsets[1:] > offsets[:-1])
    cs, ce, owner = _ranges_split(
        data, offsets[:-1][rows_nonempty], offsets[1:][rows_nonempty], _PROPERTY_SEPARATOR
    )
    row_of_chunk = rows_nonempty[owner] if len(owner) else owner
    ones = np.flatnonzero(data == _NAME_VALUE_SEPARATOR).astype(np.int64)
    if len(ones) and len(cs):
        k = np.searchsorted(ones, cs)
        sep = ones[np.minimum(k, len(ones) - 1)]
        keep = (k < len(ones)) & (sep < ce) & (sep > cs) & (ce > sep + 1)
    else:
        sep = cs
        keep = np.zeros(len(cs), bool)
    key_s, key_e = cs[keep], sep[keep]
    val_s, val_e = sep[keep] + 1, ce[keep]
    rows = row_of_chunk[keep]
    names = _gather(data_buf, key_s, key_e - key_s, pa.string())
    vals = _gather(data_buf, val_s, val_e - val_s, pa.string())
    counts = np.bincount(rows, minlength=n) if len(rows) else np.zeros(n, np.int64)
    map_offsets = np.zeros(n + 1, np.int32)
    np.cumsum(counts, out=map_offsets[1:])
    prop_map = pa.MapArray.from_arrays(pa.array(map_offsets), names, vals, type=_MAP_TYPE)
    key_len = key_e - key_s
    tags = _scatter(vals, rows, _named(data, key_s, key_len, rec.PROPERTY_TAGS.encode()), n)
    uniq = _scatter(
        vals, rows,
        _named(data, key_s, key_len, rec.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX.encode()), n,
    )
    kidx = _named(data, key_s, key_len, rec.PROPERTY_KEYS.encode())
    if len(kidx):
        # the last KEYS of a row wins, as in a Java HashMap
        last = np.full(n, -1, np.int64)
        last[rows[kidx]] = kidx
        kidx = last[last >= 0]
        ts, te, towner = _ranges_split(data, val_s[kidx], val_e[kidx], _KEY_SEPARATOR)
        nonempty = te > ts
        ts, te, trow = ts[nonempty], te[nonempty], rows[kidx][towner[nonempty]]
        kvals = _gather(data_buf, ts, te - ts, pa.string())
    else:
        trow = np.empty(0, np.int64)
        kvals = _EMPTY_STRINGS
    keys = _list_from_parts(kvals, trow, n, _KEYS_TYPE)
    return prop_map, tags, keys, uniq


class _HostCache:
    """ip:port strings of host fields; a store has few distinct hosts."""

    def __init__(self) -> None:
        self.text: dict[bytes, str] = {}

    def column(
        self, data: np.ndarray, pos: np.ndarray, lens: np.ndarray
    ) -> tuple[pa.Array, np.ndarray | None]:
        """(strings, per-row host keys (uint64: an IPv4 host field is 8 bytes) or None when
        some host is IPv6)."""
        n = len(pos)
        ipv4 = layout.IPV4_HOST_LENGTH
        if n and (lens == ipv4).all():
            raw = data[pos.astype(np.int64)[:, None] + np.arange(ipv4)]
            keys = raw.view(">u8").reshape(-1)
            first = keys[0]
            if (keys == first).all():
                return _repeat_string(self.text_of(int(first)), n), keys
            uniq, inverse = np.unique(keys, return_inverse=True)
            texts = [self.text_of(int(u)) for u in uniq.tolist()]
            return pa.array(texts, pa.string()).take(pa.array(inverse.reshape(-1))), keys
        out: list[str] = []
        for p, ln in zip(pos.tolist(), lens.tolist(), strict=True):  # IPv6 hosts: rare, per row
            b = bytes(data[p : p + ln])
            t = self.text.get(b)
            if t is None:
                t = self.text[b] = rec.decode_host(b)
            out.append(t)
        return pa.array(out, pa.string()), None

    def text_of(self, key: int) -> str:
        b = key.to_bytes(layout.IPV4_HOST_LENGTH, "big")
        t = self.text.get(b)
        if t is None:
            t = self.text[b] = rec.decode_host(b)
        return t


_SHIFTS = np.arange(60, -4, -4, dtype=np.uint64)


def _hex16(values: np.ndarray) -> np.ndarray:
    """(n, 16) uppercase hex digits (uint8) of 64-bit values."""
    nibbles = (values.astype(np.uint64)[:, None] >> _SHIFTS) & np.uint64(15)
    return _HEX[nibbles.astype(np.intp)]


def _msg_ids(data: np.ndarray, store_keys: np.ndarray | None, arr: np.ndarray) -> pa.Array:
    n = len(arr)
    if store_keys is not None:
        chars = np.empty((n, 32), np.uint8)
        first = store_keys[0]
        if (store_keys == first).all():
            chars[:, :16] = _hex16(store_keys[:1])[0]
        else:
            chars[:, :16] = _hex16(store_keys)
        chars[:, 16:] = _hex16(arr["phys_offset"].view(np.uint64))
        offsets = np.arange(0, 32 * (n + 1), 32, dtype=np.int32)
        return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets),
                                                      pa.py_buffer(chars)])
    phys = arr["phys_offset"].astype(">i8").view(np.uint8).reshape(n, 8)
    out = []
    for i in range(n):
        p, ln = int(arr["store_host_pos"][i]), int(arr["store_host_len"][i])
        out.append((bytes(data[p : p + ln]) + bytes(phys[i])).hex().upper())
    return pa.array(out, pa.string())


class BatchBuilder:
    """Turns scanned records of one mapped segment into Arrow record batches."""

    def __init__(self, store_dir: str, opts: ReadOptions) -> None:
        self.store_dir = store_dir
        self.opts = opts
        f = opts.filters
        self.topics = pa.array(sorted(f.topics), pa.string()) if f.topics is not None else None
        self.queue_ids = (
            np.array(sorted(f.queue_ids), np.int32) if f.queue_ids is not None else None
        )
        self.hosts = _HostCache()

    def _mask(self, arr: np.ndarray, topic: pa.Array | None) -> np.ndarray | None:
        f = self.opts.filters
        mask = None

        def both(m: np.ndarray) -> np.ndarray:
            return m if mask is None else (mask & m)

        if self.queue_ids is not None:
            mask = both(np.isin(arr["queue_id"], self.queue_ids))
        if f.queue_pushdown:
            # PREPARED and ROLLBACK transaction records are never in a consume queue
            tx = arr["sys_flag"] & layout.TRANSACTION_TYPE_MASK
            mask = both((tx != layout.TRANSACTION_PREPARED) & (tx != layout.TRANSACTION_ROLLBACK))
        if f.start_offset is not None:
            mask = both(arr["phys_offset"] >= f.start_offset)
        if f.end_offset is not None:
            mask = both(arr["phys_offset"] < f.end_offset)
        if f.since_ms is not None:
            mask = both(arr["store_timestamp"] >= f.since_ms)
        if f.until_ms is not None:
            mask = both(arr["store_timestamp"] < f.until_ms)
        if topic is not None and self.topics is not None:
            # pc.is_in by name: pyarrow generates its compute functions at import time
            selected = pc.call_function("is_in", [topic], pc.SetLookupOptions(self.topics))
            mask = both(selected.to_numpy(zero_copy_only=False))
        return mask

    def build(
        self, mseg: MappedSegment, arr: np.ndarray, crc_ok: np.ndarray | None
    ) -> pa.RecordBatch | None:
        """A batch of the records in ``arr`` (infos of ``mseg``) that pass the filters."""
        if not len(arr):
            return None
        buf = pa.py_buffer(mseg.mm)
        data = mseg.array
        topic = _gather(buf, arr["topic_pos"], arr["topic_len"], pa.string())
        mask = self._mask(arr, topic)
        if mask is not None and not mask.all():
            if not mask.any():
                return None
            arr = arr[mask]
            topic = topic.filter(pa.array(mask))
            if crc_ok is not None:
                crc_ok = crc_ok[mask]
        n = len(arr)
        if self.opts.include_body:
            body = _gather(buf, arr["body_pos"], arr["body_len"], pa.binary())
            if self.opts.decompress_body:
                body = _inflate_compressed(body, arr, self.opts, self.store_dir)
        else:
            body = pa.nulls(n, pa.binary())
        props = _gather(buf, arr["props_pos"], arr["props_len"], pa.string())
        prop_map, tags, keys, uniq = parse_properties(props)
        born_host, _ = self.hosts.column(data, arr["born_host_pos"], arr["born_host_len"])
        store_host, store_raw = self.hosts.column(
            data, arr["store_host_pos"], arr["store_host_len"]
        )
        if crc_ok is None:
            crc = pa.array(np.ones(n, bool)) if self.opts.verify_crc else pa.nulls(n, pa.bool_())
        else:
            crc = pa.array(crc_ok)

        def ints(name: str, typ: pa.DataType) -> pa.Array:
            return pa.array(np.ascontiguousarray(arr[name]), typ)

        def ts(name: str) -> pa.Array:
            micros = arr[name].astype(np.int64) * 1000
            return pa.Array.from_buffers(_TS, n, [None, pa.py_buffer(micros)])

        columns = [
            topic,
            ints("queue_id", pa.int32()),
            ints("queue_offset", pa.int64()),
            ints("phys_offset", pa.int64()),
            ints("size", pa.int32()),
            body,
            ints("body_crc", pa.int32()),
            crc,
            tags,
            keys,
            uniq,
            prop_map,
            ints("flag", pa.int32()),
            ints("sys_flag", pa.int32()),
            ts("born_timestamp"),
            ts("store_timestamp"),
            born_host,
            store_host,
            ints("reconsume_times", pa.int32()),
            ints("prepared_tx_offset", pa.int64()),
            _msg_ids(data, store_raw, arr),
            _repeat_string(self.store_dir, n),
        ]
        return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


#: the largest body a compressed one may inflate to (a bound against a zlib bomb in a log)
MAX_INFLATED_BODY = 64 * 1024 * 1024


def _inflate(data: bytes) -> bytes:
    inflater = zlib.decompressobj()
    out = inflater.decompress(data, MAX_INFLATED_BODY)
    if inflater.unconsumed_tail or not inflater.eof:
        raise zlib.error(f"does not inflate to a complete body within {MAX_INFLATED_BODY} bytes")
    return out


def _inflate_compressed(body: pa.Array, arr: np.ndarray, opts: ReadOptions,
                        store_dir: str) -> pa.Array:
    """``body`` with each body a producer compressed (SYSFLAG bit 0: RocketMQ's clients zlib
    bodies over compressMsgBodyOverHowmuch, 4 KiB) inflated. Python work only for those rows.
    One that does not inflate fails the read naming its offset, or with on_corrupt=emit
    stays as stored."""
    compressed = (arr["sys_flag"] & layout.SYSFLAG_COMPRESSED) != 0
    if not compressed.any():
        return body
    rows = np.flatnonzero(compressed)
    inflated = []
    for row in rows:
        stored = body[int(row)].as_py()
        try:
            inflated.append(_inflate(stored))
        except zlib.error as exc:
            if opts.on_corrupt == "emit":
                inflated.append(stored)
                continue
            offset = int(arr["phys_offset"][row])
            raise CorruptRecordError(
                f"{store_dir}: the body of the record at commitlog offset {offset} is marked "
                f"compressed (sysFlag bit 0) but {exc}; read with decompress_body=false to "
                "get the stored bytes", offset) from None
    return pc.call_function("replace_with_mask", [body, pa.array(compressed),
                                                  pa.array(inflated, pa.binary())])


def _corrupt(chunk: Chunk, pos: int, reason: str, size: int) -> CorruptRecordError:
    offset = chunk.base + pos
    return CorruptRecordError(
        f"{chunk.store_dir}: {reason} in the record at commitlog offset {offset} "
        f"(segment {chunk.path}, position {pos}, TOTALSIZE {size}); "
        + ("read with on_corrupt=emit to get it with crc_ok=false"
           if reason == "body CRC mismatch" else "the log cannot be read past it"),
        offset,
    )


def read_chunk(chunk: Chunk, opts: ReadOptions) -> Iterator[pa.RecordBatch]:
    """Record batches of the records of ``chunk`` that pass ``opts.filters``."""
    flags = _backend.SCAN_CHECK_CRC if opts.verify_crc else 0
    builder = BatchBuilder(chunk.store_dir, opts)
    seg = Segment(chunk.path, chunk.base, chunk.limit)
    mseg = MappedSegment(seg)
    try:
        if mseg.size < chunk.limit:
            raise StoreError(f"{chunk.path}: segment shrank below position {chunk.limit}")
        scanner = _backend.engine.scanner(opts.batch_rows)
        hard = chunk.limit
        for start, stop in chunk.ranges:
            pos = start
            if pos < hard and not mseg.is_record_start(pos):
                head = mseg.header(pos)
                raise _corrupt(chunk, pos, "no record starts here (stale consume queue? "
                               "read with use_consume_queues=false)", head[0] if head else 0)
            while pos < stop and pos < hard:
                limit = min(hard, stop + opts.max_record, pos + max(BATCH_BYTES, opts.max_record))
                res = scanner.scan(mseg.handle, limit, pos, chunk.base, flags, opts.max_record)
                count = res.count
                arr = infos_to_numpy(res.infos, count)
                crc_ok = None
                next_pos = res.end
                if res.stop == _backend.STOP_BAD_CRC and res.end < stop:
                    if opts.on_corrupt != "emit":
                        raise _corrupt(chunk, res.end, "body CRC mismatch", res.size)
                    bad = infos_to_numpy(res.infos, count + 1)[count:]
                    arr = np.concatenate([arr, bad])
                    crc_ok = np.ones(len(arr), bool)
                    crc_ok[-1] = False
                    next_pos = res.end + res.size
                if len(arr) and arr["phys_offset"][-1] - chunk.base >= stop:
                    k = int(np.searchsorted(arr["phys_offset"], chunk.base + stop))
                    arr = arr[:k]
                    if crc_ok is not None:
                        crc_ok = crc_ok[:k]
                    next_pos = stop
                batch = builder.build(mseg, arr, crc_ok)
                if batch is not None:
                    yield batch
                if next_pos >= stop:
                    break
                stop_reason = res.stop
                if stop_reason in (_backend.STOP_FULL, _backend.STOP_BAD_CRC):
                    pos = next_pos
                    continue
                if stop_reason == _backend.STOP_BLANK:
                    break
                if stop_reason in (_backend.STOP_END, _backend.STOP_PARTIAL) and limit < hard:
                    # the scan window ended (it always holds a whole record: it is at least
                    # max_record long, and larger records are BAD_SIZE)
                    if next_pos <= pos:
                        raise _corrupt(chunk, pos, res.reason, res.size)
                    pos = next_pos
                    continue
                if stop_reason == _backend.STOP_END:
                    break
                raise _corrupt(chunk, res.end, res.reason, res.size)
    finally:
        mseg.close()
