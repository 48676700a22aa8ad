"""The on-disk layout, in one place: where each field of a commitlog record sits, what a
consume-queue entry and the blank markers look like, how segment files are named, and the
masks and limits that go with them (docs/formats.md tells the whole story).

Everything that reads stored bytes by position — the store, the Python twin of the native
engine, the broker's tag filter, the Spark reader, the test helpers — asks this module, so a
change of layout is a change of this file. It has no dependencies: the Spark executors and the
record codec import it without trio.

A v1 record (all integers big-endian; the hosts are 8 bytes for IPv4, 20 for IPv6, chosen by
two SYSFLAG bits)::

    TOTALSIZE 4 | MAGIC 4 | BODYCRC 4 | QUEUEID 4 | FLAG 4 | QUEUEOFFSET 8 | PHYSICALOFFSET 8
    | SYSFLAG 4 | BORNTIMESTAMP 8 | BORNHOST 8|20 | STORETIMESTAMP 8 | STOREHOST 8|20
    | RECONSUMETIMES 4 | PREPAREDTRANSACTIONOFFSET 8 | BODYLEN 4 + body
    | TOPICLEN 1 (v1) or 2 (v2) + topic | PROPSLEN 2 + properties
"""

from __future__ import annotations

import re
import struct

# ---- integer limits and masks ---------------------------------------------------------------

INT32_MIN = -(2**31)
INT32_MAX = 0x7FFFFFFF
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
#: BODYCRC is zlib's CRC-32 masked to 31 bits (RocketMQ keeps it a positive Java int)
CRC_MASK = 0x7FFFFFFF

# ---- commitlog records ---------------------------------------------------------------------

MAGIC_V1 = 0xDAA320A7
MAGIC_V2 = 0xDAA320AB
#: the MAGIC of the filler that ends a segment; its TOTALSIZE is the rest of the segment
BLANK_MAGIC = 0xCBD43194
#: a segment with less room than this left ends without a blank record (TOTALSIZE + MAGIC)
END_FILE_MIN_BLANK_LENGTH = 8

# Fixed field positions, from the start of a record.
TOTALSIZE_AT = 0
MAGIC_AT = 4
BODYCRC_AT = 8
QUEUEID_AT = 12
FLAG_AT = 16
QUEUEOFFSET_AT = 20
PHYSICALOFFSET_AT = 28
SYSFLAG_AT = 36
BORNTIMESTAMP_AT = 40
BORNHOST_AT = 48
#: TOTALSIZE .. BORNTIMESTAMP: the part of every record at fixed positions
HEAD = struct.Struct(">iIiiiqqiq")
#: bytes before BODYLEN when both hosts are IPv4
FIXED_PART_IPV4 = 84

IPV4_HOST_LENGTH = 8
IPV6_HOST_LENGTH = 20

# SYSFLAG bits (RocketMQ's MessageSysFlag).
SYSFLAG_COMPRESSED = 0x1
SYSFLAG_MULTI_TAGS = 0x2
TRANSACTION_TYPE_MASK = 0xC
TRANSACTION_NOT_TYPE = 0x0
TRANSACTION_PREPARED = 0x4
TRANSACTION_COMMIT = 0x8
TRANSACTION_ROLLBACK = 0xC
SYSFLAG_BORNHOST_V6 = 0x10
SYSFLAG_STOREHOST_V6 = 0x20

MAX_TOPIC_LENGTH = 127  # v1 stores the topic length in one signed byte
MAX_PROPERTIES_LENGTH = 32767  # a signed short
DEFAULT_MAX_MESSAGE_SIZE = 4 * 1024 * 1024

#: TOTALSIZE and MAGIC: enough to tell a record from a blank and how long it is
RECORD_START = struct.Struct(">iI")
#: the big-endian field widths every variable part of a record uses
INT32 = struct.Struct(">i")
UINT16 = struct.Struct(">H")
INT64 = struct.Struct(">q")


def born_host_length(sys_flag: int) -> int:
    return IPV6_HOST_LENGTH if sys_flag & SYSFLAG_BORNHOST_V6 else IPV4_HOST_LENGTH


def store_host_length(sys_flag: int) -> int:
    return IPV6_HOST_LENGTH if sys_flag & SYSFLAG_STOREHOST_V6 else IPV4_HOST_LENGTH


def store_timestamp_at(sys_flag: int) -> int:
    """Where STORETIMESTAMP sits (it follows BORNHOST, whose length SYSFLAG chooses)."""
    return BORNHOST_AT + born_host_length(sys_flag)


def body_length_at(sys_flag: int) -> int:
    """Where BODYLEN sits: after STOREHOST, RECONSUMETIMES and PREPAREDTRANSACTIONOFFSET."""
    return store_timestamp_at(sys_flag) + 8 + store_host_length(sys_flag) + 12


def read_sys_flag(record: bytes | bytearray | memoryview, at: int = 0) -> int:
    return INT32.unpack_from(record, at + SYSFLAG_AT)[0]


def read_store_timestamp(record: bytes | bytearray | memoryview, at: int = 0) -> int:
    """STORETIMESTAMP of the record at ``record[at:]`` (it needs the first 72 bytes with IPv4
    born hosts, 84 with IPv6)."""
    return INT64.unpack_from(record, at + store_timestamp_at(read_sys_flag(record, at)))[0]


def properties_slice(record: bytes | bytearray | memoryview) -> bytes | bytearray | memoryview:
    """The raw PROPERTIES field of one whole record, found by walking its declared lengths
    without decoding the body. The caller has validated the record (the store serves only
    records that passed its checks); a short buffer yields a short or empty slice, never an
    index error."""
    sys_flag = read_sys_flag(record)
    position = body_length_at(sys_flag)
    if position + 4 > len(record):
        return record[0:0]
    body_length: int = INT32.unpack_from(record, position)[0]
    position += 4 + max(body_length, 0)
    if INT32.unpack_from(record, MAGIC_AT)[0] & 0xFFFFFFFF == MAGIC_V2:
        if position + 2 > len(record):
            return record[0:0]
        position += 2 + UINT16.unpack_from(record, position)[0]
    else:
        if position + 1 > len(record):
            return record[0:0]
        position += 1 + record[position]
    if position + 2 > len(record):
        return record[0:0]
    length = UINT16.unpack_from(record, position)[0]
    return record[position + 2 : position + 2 + length]


# ---- consume queues ------------------------------------------------------------------------

#: commitlog offset 8 | record size 4 | tags code 8
CQ_ENTRY = struct.Struct(">qiq")
CQ_ENTRY_SIZE = 20
#: the size of the filler entries at the head of a queue that starts past 0 (RocketMQ writes
#: (0, INT32_MAX, 0) there); a reader skips them
CQ_BLANK_SIZE = INT32_MAX
CQ_BLANK_ENTRY = CQ_ENTRY.pack(0, CQ_BLANK_SIZE, 0)
DEFAULT_CQ_ENTRIES_PER_FILE = 300_000

# ---- segment files -------------------------------------------------------------------------

DEFAULT_COMMITLOG_SEGMENT_SIZE = 1024 * 1024 * 1024
#: exactly 20 ASCII digits (``\d`` would take other scripts' digits, ``$`` a trailing newline)
SEGMENT_NAME_RE = re.compile(r"[0-9]{20}")


def segment_file_name(base_offset: int) -> str:
    """A segment (commitlog or consume queue) is named by its first byte's offset in the
    log, as 20 zero-padded decimal digits."""
    return f"{base_offset:020d}"


def parse_segment_file_name(name: str) -> int | None:
    """The base offset a segment file name stands for, or None for any other file."""
    return int(name) if SEGMENT_NAME_RE.fullmatch(name) else None
