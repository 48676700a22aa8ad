"""RocketMQ commitlog records: layout, values, and a pure-Python codec.

This is the reference implementation of the record format (docs/formats.md, 'Commitlog
record'). The store's hot paths use the native encoder and scanner, which must produce and
accept exactly these bytes; the tests hold the two against each other. Nothing here does
I/O: bytes in, frozen values out.

Layout of a v1 record (all integers big-endian)::

    TOTALSIZE 4 | MAGIC 4 | BODYCRC 4 | QUEUEID 4 | FLAG 4 | QUEUEOFFSET 8 | PHYSICALOFFSET 8
    | SYSFLAG 4 | BORNTIMESTAMP 8 | BORNHOST 8|20 | STORETIMESTAMP 8 | STOREHOST 8|20
    | RECONSUMETIMES 4 | PREPAREDTRANSACTIONOFFSET 8 | BODYLEN 4 + body
    | TOPICLEN 1 (v1) or 2 (v2) + topic | PROPSLEN 2 + properties

A segment ends with a blank record: TOTALSIZE = the rest of the segment, MAGIC = BLANK.

Why one module at about 600 lines: it is the record format, whole (layout, message ids,
property encoding, the codec both ways); the native engine is held to exactly this file.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
import struct
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from .errors import RecordDecodeError
from .layout import (
    BLANK_MAGIC,
    CRC_MASK,
    DEFAULT_MAX_MESSAGE_SIZE,
    END_FILE_MIN_BLANK_LENGTH,
    FIXED_PART_IPV4,
    HEAD,
    INT32,
    INT64,
    IPV4_HOST_LENGTH,
    IPV6_HOST_LENGTH,
    MAGIC_V1,
    MAGIC_V2,
    MAX_PROPERTIES_LENGTH,
    MAX_TOPIC_LENGTH,
    RECORD_START,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_COMPRESSED,
    SYSFLAG_MULTI_TAGS,
    SYSFLAG_STOREHOST_V6,
    TRANSACTION_COMMIT,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_PREPARED,
    TRANSACTION_ROLLBACK,
    TRANSACTION_TYPE_MASK,
    UINT16,
    born_host_length,
    store_host_length,
)

__all__ = [
    # The layout's facts live in layout.py; these are re-exported because callers of the
    # codec write ``rec.MAGIC_V1``, ``rec.TRANSACTION_PREPARED``.
    "BLANK_MAGIC", "DEFAULT_MAX_MESSAGE_SIZE", "END_FILE_MIN_BLANK_LENGTH", "FIXED_PART_IPV4",
    "MAGIC_V1", "MAGIC_V2", "MAX_PROPERTIES_LENGTH", "MAX_TOPIC_LENGTH", "SYSFLAG_BORNHOST_V6",
    "SYSFLAG_COMPRESSED", "SYSFLAG_MULTI_TAGS", "SYSFLAG_STOREHOST_V6", "TRANSACTION_COMMIT",
    "TRANSACTION_NOT_TYPE", "TRANSACTION_PREPARED", "TRANSACTION_ROLLBACK",
    "TRANSACTION_TYPE_MASK",
    # The codec itself.
    "NAME_VALUE_SEPARATOR", "PROPERTY_SEPARATOR", "PROPERTY_KEYS", "PROPERTY_TAGS",
    "PROPERTY_WAIT_STORE_MSG_OK", "PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX",
    "PROPERTY_DELAY_TIME_LEVEL", "PROPERTY_REAL_TOPIC", "PROPERTY_REAL_QUEUE_ID",
    "PROPERTY_RETRY_TOPIC", "PROPERTY_ORIGIN_MESSAGE_ID", "PROPERTY_TRANSACTION_PREPARED",
    "PROPERTY_PRODUCER_GROUP", "RecordDecodeError",
    "body_crc", "java_string_hash", "tags_code", "encode_host", "parse_host_port",
    "decode_host", "message_id", "decode_message_id", "encode_properties", "decode_properties",
    "Message", "StoredMessage", "record_size", "encode_record", "encode_blank", "encode_batch",
    "encode_batch_items",
    "BatchItem", "decode_batch", "RecordHeader", "peek_header", "decode_record",
]

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

# Property keys the store and broker read (MessageConst).
PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_WAIT_STORE_MSG_OK = "WAIT"
PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX = "UNIQ_KEY"
#: a delayed message's level (1..), and where a delayed message was bound before the broker
#: moved it to SCHEDULE_TOPIC_XXXX
PROPERTY_DELAY_TIME_LEVEL = "DELAY"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
#: a retried message's first topic, and the msgId it had there
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
#: a transactional half message ("true"), and the producer group its check goes to
PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP = "PGROUP"

# A SEND_BATCH_MESSAGE item (a network format, not a stored one): TOTALSIZE, MAGIC, BODYCRC,
# FLAG, then BODYLEN + body and PROPSLEN + properties.
_BATCH_ITEM_HEAD = struct.Struct(">iiii")
_BATCH_ITEM_MIN = _BATCH_ITEM_HEAD.size + 4 + 2
_HOST_LENGTHS = (IPV4_HOST_LENGTH, IPV6_HOST_LENGTH)


def body_crc(body: bytes | bytearray | memoryview) -> int:
    """BODYCRC as RocketMQ stores it: zlib's CRC-32 of the body, masked to 31 bits."""
    return zlib.crc32(body) & CRC_MASK


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode``: 31*h + each UTF-16 code unit, as a signed 32-bit int.

    RocketMQ stores it as the consume-queue tagsCode, sign-extended to 64 bits.
    """
    units = text.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(units), 2):
        h = (31 * h + ((units[i] << 8) | units[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def tags_code(tags: str | None) -> int:
    """The consume queue's tag slot for a message with these tags (0 when none)."""
    return java_string_hash(tags) if tags else 0


# ---- hosts ------------------------------------------------------------------------------


def encode_host(host: str, port: int) -> bytes:
    """A born/store host field: 4 or 16 address bytes, then the port as a 4-byte int."""
    address = ipaddress.ip_address(host)
    if not 0 <= port <= 0xFFFF:
        raise ValueError(f"port out of range: {port}")
    return address.packed + INT32.pack(port)


def parse_host_port(text: str) -> tuple[str, int]:
    """``'1.2.3.4:10911'`` or ``'[::1]:10911'`` into (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected host:port, got {text!r}")
    return host.strip("[]"), int(port)


def decode_host(field: bytes | memoryview) -> str:
    """A host field back into ``ip:port`` (IPv6 addresses in brackets). Runs for two fields
    of every decoded record, so it uses the socket module's C formatters, not ipaddress."""
    raw = bytes(field)
    if len(raw) == IPV4_HOST_LENGTH:
        return f"{socket.inet_ntop(socket.AF_INET, raw[:4])}:{INT32.unpack_from(raw, 4)[0]}"
    if len(raw) == IPV6_HOST_LENGTH:
        return f"[{socket.inet_ntop(socket.AF_INET6, raw[:16])}]:{INT32.unpack_from(raw, 16)[0]}"
    raise RecordDecodeError(f"host field must be 8 or 20 bytes, got {len(raw)}")


def message_id(store_host: bytes, commitlog_offset: int) -> str:
    """RocketMQ's offsetMsgId: hex of store address, store port and commitlog offset."""
    return (store_host + INT64.pack(commitlog_offset)).hex().upper()


def joined_message_ids(store_host: bytes, commitlog_offsets: tuple[int, ...]) -> str:
    """The offsetMsgIds of several records on one host, comma-joined (a batch's reply): the
    offsets packed and hexed in one call each, and the host's hex put before each, rather
    than a ``message_id`` per record (a batch of 32 took 5 % of a broker's CPU that way)."""
    if len(commitlog_offsets) < 2:
        return message_id(store_host, commitlog_offsets[0]) if commitlog_offsets else ""
    host = store_host.hex().upper()
    packed = struct.pack(f">{len(commitlog_offsets)}q", *commitlog_offsets)
    return host + packed.hex(",", 8).upper().replace(",", "," + host)


def decode_message_id(msg_id: str) -> tuple[str, int]:
    """An offsetMsgId back into (``ip:port``, commitlog offset)."""
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raise RecordDecodeError(f"message id is not hex: {msg_id!r}") from None
    if len(raw) not in (16, 28):
        raise RecordDecodeError(f"message id must be 32 or 56 hex digits, got {len(msg_id)}")
    return decode_host(raw[:-8]), INT64.unpack_from(raw, len(raw) - 8)[0]


# ---- properties -------------------------------------------------------------------------


def encode_properties(properties: Mapping[str, str], *, trailing_separator: bool = False) -> str:
    """``name\\x01value\\x02...``; RocketMQ 4.9.1-5.1 omit the last ``\\x02``, others keep it."""
    text = PROPERTY_SEPARATOR.join(
        f"{name}{NAME_VALUE_SEPARATOR}{value}" for name, value in properties.items()
    )
    if trailing_separator and text:
        text += PROPERTY_SEPARATOR
    return text


def decode_properties(raw: bytes | bytearray | memoryview | str) -> dict[str, str]:
    """Parse properties the way RocketMQ does: both separator styles, empty parts dropped."""
    text = raw if isinstance(raw, str) else bytes(raw).decode("utf-8", "replace")
    result: dict[str, str] = {}
    for chunk in text.split(PROPERTY_SEPARATOR):
        if len(chunk) < 3:
            continue
        name, sep, value = chunk.partition(NAME_VALUE_SEPARATOR)
        if sep and name and value:
            result[name] = value
    return result


# ---- values -------------------------------------------------------------------------------


def _keys_value(keys: str | Iterable[str] | None) -> str | tuple[str, ...] | None:
    return keys if keys is None or isinstance(keys, str) else tuple(keys)


def _properties_value(properties: Mapping[str, str]) -> dict[str, str]:
    return dict(properties)


# The default of ``Message.properties``: the converter copies it, so one shared empty dict
# serves every message (and gives the field its type, which ``factory=dict`` leaves unknown).
_NO_PROPERTIES: Mapping[str, str] = {}


def _keys_text(keys: str | Iterable[str] | None) -> str | None:
    if keys is None:
        return None
    if isinstance(keys, str):
        return keys
    return " ".join(keys)


def _topic_value(instance: Any, attribute: Any, topic: Any) -> None:
    if not isinstance(topic, str):
        raise TypeError(f"Message topic must be a str, got {type(topic).__name__}")


def _body_value(instance: Any, attribute: Any, body: Any) -> None:
    # A str body would fail only at send, far from the mistake; RocketMQ's Message takes
    # byte[] for the same reason.
    if not isinstance(body, (bytes, bytearray, memoryview)):
        hint = " (encode it: text.encode())" if isinstance(body, str) else ""
        raise TypeError(f"Message body must be bytes, got {type(body).__name__}{hint}")


@attrs.frozen
class Message:
    """A message to put: what a producer sends. TAGS and KEYS become properties."""

    topic: str = attrs.field(validator=_topic_value)
    body: bytes = attrs.field(validator=_body_value)
    tags: str | None = None
    keys: str | tuple[str, ...] | None = attrs.field(default=None, converter=_keys_value)
    properties: Mapping[str, str] = attrs.field(default=_NO_PROPERTIES, converter=_properties_value)
    flag: int = 0
    sys_flag: int = 0
    born_timestamp: int | None = None  # epoch ms; the store's clock when None
    born_host: str | None = None  # "ip:port"; the store host when None
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0

    def all_properties(self) -> dict[str, str]:
        """Properties as stored: TAGS, KEYS, then the rest in insertion order."""
        merged: dict[str, str] = {}
        if self.tags:
            merged[PROPERTY_TAGS] = self.tags
        keys = _keys_text(self.keys)
        if keys:
            merged[PROPERTY_KEYS] = keys
        merged.update(self.properties)
        return merged

    def encoded_properties(self, *, trailing_separator: bool = False) -> bytes:
        """The PROPERTIES field of this message's record (the put path calls this for every
        message, so it avoids building the merged dict when it can)."""
        properties = self.properties
        if PROPERTY_TAGS in properties or PROPERTY_KEYS in properties:
            text = encode_properties(self.all_properties())
        else:
            parts: list[str] = []
            if self.tags:
                parts.append("TAGS\x01" + self.tags)
            keys = self.keys
            if keys:
                parts.append("KEYS\x01" + (keys if isinstance(keys, str) else " ".join(keys)))
            if properties:
                parts.extend([f"{name}\x01{value}" for name, value in properties.items()])
            text = "\x02".join(parts)
        if trailing_separator and text:
            text += PROPERTY_SEPARATOR
        return text.encode()


@attrs.frozen
class StoredMessage:
    """A record as it sits in the commitlog, every field decoded."""

    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    size: int
    body: bytes
    body_crc: int
    flag: int
    sys_flag: int
    born_timestamp: int
    born_host: str
    store_timestamp: int
    store_host: str
    reconsume_times: int
    prepared_transaction_offset: int
    #: the PROPERTIES field as stored; ``properties`` is it decoded
    raw_properties: bytes
    version: int = 1
    #: properties the reader adds to the stored ones (a client adds MIN/MAX_OFFSET to every
    #: pulled message); shared by the messages of one read, not copied
    extra_properties: Mapping[str, str] | None = attrs.field(default=None, repr=False)

    @functools.cached_property
    def properties(self) -> dict[str, str]:
        """The properties, decoded on first use: a consumer that reads only bodies (a pull of
        32 spends a fifth of its decoding here) never pays for them."""
        properties = decode_properties(self.raw_properties)
        if self.extra_properties:
            properties.update(self.extra_properties)
        return properties

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(k for k in self.properties.get(PROPERTY_KEYS, "").split(" ") if k)

    @property
    def msg_id(self) -> str:
        """The offsetMsgId of this record."""
        return message_id(encode_host(*parse_host_port(self.store_host)), self.commitlog_offset)

    @property
    def crc_ok(self) -> bool:
        return body_crc(self.body) == self.body_crc


# ---- encoding ------------------------------------------------------------------------------


def record_size(
    body_len: int,
    topic_len: int,
    props_len: int,
    *,
    born_host_len: int = IPV4_HOST_LENGTH,
    store_host_len: int = IPV4_HOST_LENGTH,
    version: int = 1,
) -> int:
    """TOTALSIZE of a record with these variable parts (91 + N + T + P for IPv4 v1)."""
    topic_width = 1 if version == 1 else 2
    return (
        FIXED_PART_IPV4 - 2 * IPV4_HOST_LENGTH + born_host_len + store_host_len
        + 4 + max(body_len, 0) + topic_width + topic_len + 2 + props_len
    )


def encode_record(
    *,
    topic: bytes,
    body: bytes,
    properties: bytes,
    queue_id: int,
    flag: int,
    queue_offset: int,
    commitlog_offset: int,
    sys_flag: int,
    born_timestamp: int,
    born_host: bytes,
    store_timestamp: int,
    store_host: bytes,
    reconsume_times: int = 0,
    prepared_transaction_offset: int = 0,
    version: int = 1,
) -> bytes:
    """One record, byte for byte as RocketMQ's CommitLog encoder writes it."""
    if version not in (1, 2):
        raise ValueError(f"unknown record version {version}")
    # The host fields decide the V6 bits; a stale bit would make the record unreadable.
    sys_flag &= ~(SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6)
    if len(born_host) == IPV6_HOST_LENGTH:
        sys_flag |= SYSFLAG_BORNHOST_V6
    if len(store_host) == IPV6_HOST_LENGTH:
        sys_flag |= SYSFLAG_STOREHOST_V6
    if len(born_host) not in _HOST_LENGTHS or len(store_host) not in _HOST_LENGTHS:
        raise ValueError("host fields must be 8 or 20 bytes")
    if version == 1 and len(topic) > MAX_TOPIC_LENGTH:
        raise ValueError(f"topic longer than {MAX_TOPIC_LENGTH} bytes needs a v2 record")
    if len(properties) > MAX_PROPERTIES_LENGTH:
        raise ValueError(f"properties longer than {MAX_PROPERTIES_LENGTH} bytes")
    size = record_size(
        len(body), len(topic), len(properties),
        born_host_len=len(born_host), store_host_len=len(store_host), version=version,
    )
    parts = [
        HEAD.pack(
            size, MAGIC_V1 if version == 1 else MAGIC_V2, body_crc(body), queue_id, flag,
            queue_offset, commitlog_offset, sys_flag, born_timestamp,
        ),
        born_host,
        INT64.pack(store_timestamp),
        store_host,
        INT32.pack(reconsume_times),
        INT64.pack(prepared_transaction_offset),
        INT32.pack(len(body)),
        body,
        bytes([len(topic)]) if version == 1 else UINT16.pack(len(topic)),
        topic,
        UINT16.pack(len(properties)),
        properties,
    ]
    out = b"".join(parts)
    assert len(out) == size
    return out


def encode_blank(remaining: int) -> bytes:
    """The 8-byte end-of-segment marker: TOTALSIZE = bytes left in the segment."""
    return RECORD_START.pack(remaining, BLANK_MAGIC)


def encode_batch(messages: Iterable[Message], *, trailing_separator: bool = False) -> bytes:
    """A SEND_BATCH_MESSAGE body, as a RocketMQ client encodes it (docs/remoting.md, 'Send')."""
    return encode_batch_items(
        (m.flag, m.body, m.encoded_properties(trailing_separator=trailing_separator))
        for m in messages
    )


def encode_batch_items(items: Iterable[tuple[int, bytes, bytes]]) -> bytes:
    """A SEND_BATCH_MESSAGE body of (flag, body, encoded properties) items."""
    parts: list[bytes] = []
    item_head, int32, uint16 = _BATCH_ITEM_HEAD.pack, INT32.pack, UINT16.pack
    for flag, body, props in items:
        if len(props) > MAX_PROPERTIES_LENGTH:
            raise ValueError(f"properties longer than {MAX_PROPERTIES_LENGTH} bytes")
        parts += (item_head(_BATCH_ITEM_MIN + len(body) + len(props), 0, 0, flag),
                  int32(len(body)), body, uint16(len(props)), props)
    return b"".join(parts)


@attrs.frozen
class BatchItem:
    flag: int
    body: bytes
    properties: bytes


def decode_batch(data: bytes | memoryview, *, max_items: int = 1 << 16) -> list[BatchItem]:
    """Split a SEND_BATCH_MESSAGE body into items, validating every declared length."""
    view = memoryview(data)
    items: list[BatchItem] = []
    pos = 0
    while pos < len(view):
        if len(items) >= max_items:
            raise RecordDecodeError(f"batch has more than {max_items} items")
        if len(view) - pos < _BATCH_ITEM_MIN:
            raise RecordDecodeError(f"batch item at {pos} is truncated")
        size, _magic, _crc, flag = _BATCH_ITEM_HEAD.unpack_from(view, pos)
        body_len = INT32.unpack_from(view, pos + _BATCH_ITEM_HEAD.size)[0]
        body_at = pos + _BATCH_ITEM_HEAD.size + 4
        if body_len < 0 or body_at + body_len + 2 > len(view):
            raise RecordDecodeError(f"batch item at {pos} has a bad body length {body_len}")
        props_len = UINT16.unpack_from(view, body_at + body_len)[0]
        end = body_at + body_len + 2 + props_len
        if end > len(view) or size != end - pos:
            raise RecordDecodeError(f"batch item at {pos} has inconsistent sizes")
        items.append(
            BatchItem(
                flag=flag,
                body=bytes(view[body_at : body_at + body_len]),
                properties=bytes(view[body_at + body_len + 2 : end]),
            )
        )
        pos = end
    return items


# ---- decoding ------------------------------------------------------------------------------


@attrs.frozen
class RecordHeader:
    """What a scan needs of a record without touching its body."""

    size: int
    magic: int

    @property
    def is_blank(self) -> bool:
        return self.magic == BLANK_MAGIC


#: the largest record ``decode_record`` accepts by default: the largest body a broker takes
#: plus room for properties and the fixed part
MAX_DECODED_RECORD = DEFAULT_MAX_MESSAGE_SIZE + 64 * 1024 + 65536


def peek_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> RecordHeader:
    """TOTALSIZE and MAGIC at ``pos`` (8 bytes must be present)."""
    if len(buf) - pos < RECORD_START.size:
        raise RecordDecodeError(f"need {RECORD_START.size} bytes for a record header at {pos}")
    size, magic = RECORD_START.unpack_from(buf, pos)
    return RecordHeader(size, magic)


def decode_record(
    buf: bytes | bytearray | memoryview,
    pos: int = 0,
    *,
    check_crc: bool = False,
    max_size: int = MAX_DECODED_RECORD,
    extra_properties: Mapping[str, str] | None = None,
) -> StoredMessage:
    """Decode the record at ``buf[pos:]``. Every declared length is checked against the buffer
    and against TOTALSIZE before it is used; any problem raises RecordDecodeError.
    ``extra_properties`` are added to the decoded ones (a client adds MIN/MAX_OFFSET to
    every pulled message: cheaper here than copying each message afterwards)."""
    view = memoryview(buf)
    avail = len(view) - pos
    header = peek_header(view, pos)
    if header.magic == MAGIC_V1:
        version = 1
    elif header.magic == MAGIC_V2:
        version = 2
    elif header.is_blank:
        raise RecordDecodeError(f"blank (end-of-segment) record at {pos}")
    else:
        raise RecordDecodeError(f"bad magic {header.magic:#010x} at {pos}")
    size = header.size
    if size < record_size(0, 0, 0) or size > max_size:
        raise RecordDecodeError(f"record size {size} at {pos} out of range")
    if size > avail:
        raise RecordDecodeError(f"record at {pos} needs {size} bytes, {avail} available")
    rec = view[pos : pos + size]
    (
        _size, _magic, crc, queue_id, flag, queue_offset, commitlog_offset, sys_flag,
        born_timestamp,
    ) = HEAD.unpack_from(rec, 0)
    # Declared: the lengths unpacked below are Any to the checker, and p indexes with them.
    p: int = HEAD.size
    born_len = born_host_length(sys_flag)
    store_len = store_host_length(sys_flag)
    try:
        born_host = rec[p : p + born_len]
        p += born_len
        (store_timestamp,) = INT64.unpack_from(rec, p)
        p += 8
        store_host = rec[p : p + store_len]
        p += store_len
        (reconsume_times,) = INT32.unpack_from(rec, p)
        (prepared,) = INT64.unpack_from(rec, p + 4)
        (body_len,) = INT32.unpack_from(rec, p + 12)
        p += 16
        if body_len < 0 or p + body_len > size:
            raise RecordDecodeError(f"record at {pos}: body length {body_len} out of range")
        body = bytes(rec[p : p + body_len])
        p += body_len
        if version == 1:
            topic_len = rec[p]
            p += 1
        else:
            (topic_len,) = UINT16.unpack_from(rec, p)
            p += 2
        topic = bytes(rec[p : p + topic_len])
        p += topic_len
        (props_len,) = UINT16.unpack_from(rec, p)
        p += 2
        props = rec[p : p + props_len]
        p += props_len
    except (struct.error, IndexError):
        raise RecordDecodeError(f"record at {pos} is shorter than its fields") from None
    if p != size:
        raise RecordDecodeError(f"record at {pos}: fields add up to {p}, TOTALSIZE is {size}")
    if check_crc and body_crc(body) != crc:
        raise RecordDecodeError(f"record at {pos}: body CRC mismatch")
    try:
        topic_text = topic.decode("utf-8")
    except UnicodeDecodeError:
        raise RecordDecodeError(f"record at {pos}: topic is not UTF-8") from None
    return StoredMessage(
        topic=topic_text,
        queue_id=queue_id,
        queue_offset=queue_offset,
        commitlog_offset=commitlog_offset,
        size=size,
        body=body,
        body_crc=crc,
        flag=flag,
        sys_flag=sys_flag,
        born_timestamp=born_timestamp,
        born_host=decode_host(born_host),
        store_timestamp=store_timestamp,
        store_host=decode_host(store_host),
        reconsume_times=reconsume_times,
        prepared_transaction_offset=prepared,
        raw_properties=bytes(props),
        version=version,
        extra_properties=extra_properties or None,
    )
