"""A separate reference encoder for the Spark tests: RocketMQ store files byte for byte.

Written from the project's RocketMQ fact sheet (``../shared/spec/rocketmq-reference.md``
§1-3, beside this repository; docs/formats.md states the same facts) with struct and zlib only —
it shares no code with trio_ha — so the data source is checked against an independent reading
of the format: v1 and v2 records, IPv4 and IPv6 hosts, both property separator styles, the
8-byte blank record that closes a segment when the next record (plus 8 bytes) does not fit,
20-digit segment names, and consume-queue entries (offset, size, tags hash) with PREPARED and
ROLLBACK transaction records left out of the queues.
"""

from __future__ import annotations

import ipaddress
import os
import struct
import zlib
from dataclasses import dataclass, field

MAGIC_V1 = 0xDAA320A7
MAGIC_V2 = 0xDAA320AB
BLANK = 0xCBD43194
CQ_ENTRY = struct.Struct(">qiq")


def java_hash(text: str) -> int:
    h = 0
    data = text.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i : i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def host_bytes(text: str) -> bytes:
    host, _, port = text.rpartition(":")
    return ipaddress.ip_address(host.strip("[]")).packed + struct.pack(">i", int(port))


@dataclass
class GoldenMessage:
    topic: str
    body: bytes
    queue_id: int = 0
    properties: list = field(default_factory=list)  # [(name, value)], in order
    trailing_separator: bool = False
    flag: int = 0
    sys_flag: int = 0
    born_timestamp: int = 1_700_000_000_000
    store_timestamp: int = 1_700_000_000_000
    born_host: str = "192.168.0.10:51000"
    store_host: str = "10.1.2.3:10911"
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    version: int = 1
    # filled in by the writer
    queue_offset: int = 0
    commitlog_offset: int = 0
    size: int = 0

    def props_text(self) -> bytes:
        text = "\x02".join(f"{k}\x01{v}" for k, v in self.properties)
        if self.trailing_separator and text:
            text += "\x02"
        return text.encode()

    @property
    def dispatched(self) -> bool:
        return (self.sys_flag & 0xC) not in (0x4, 0xC)

    def expected_row(self, store_dir: str) -> dict:
        """Every column of the data source's row for this record."""
        props = {}
        for chunk in self.props_text().decode().split("\x02"):
            name, sep, value = chunk.partition("\x01")
            if sep and name and value:
                props[name] = value
        store_raw = host_bytes(self.store_host)

        def host_text(t):
            h, _, p = t.rpartition(":")
            ip = ipaddress.ip_address(h.strip("[]"))
            return f"[{ip}]:{p}" if ip.version == 6 else f"{ip}:{p}"

        return {
            "topic": self.topic, "queue_id": self.queue_id, "queue_offset": self.queue_offset,
            "commitlog_offset": self.commitlog_offset, "size": self.size, "body": self.body,
            "body_crc": zlib.crc32(self.body) & 0x7FFFFFFF, "crc_ok": True,
            "tags": props.get("TAGS"),
            "keys": [k for k in props.get("KEYS", "").split(" ") if k],
            "uniq_key": props.get("UNIQ_KEY"), "properties": props, "flag": self.flag,
            "sys_flag": self.sys_flag | (0x10 if len(host_bytes(self.born_host)) == 20 else 0)
            | (0x20 if len(store_raw) == 20 else 0),
            "born_timestamp_ms": self.born_timestamp, "store_timestamp_ms": self.store_timestamp,
            "born_host": host_text(self.born_host), "store_host": host_text(self.store_host),
            "reconsume_times": self.reconsume_times,
            "prepared_transaction_offset": self.prepared_transaction_offset,
            "msg_id": (store_raw + struct.pack(">q", self.commitlog_offset)).hex().upper(),
            "store_dir": store_dir,
        }


def encode(m: GoldenMessage) -> bytes:
    """One record as CommitLog's encoder lays it out (docs/formats.md, 'Commitlog record')."""
    born = host_bytes(m.born_host)
    store = host_bytes(m.store_host)
    sys_flag = m.sys_flag
    if len(born) == 20:
        sys_flag |= 0x10
    if len(store) == 20:
        sys_flag |= 0x20
    topic = m.topic.encode()
    props = m.props_text()
    topic_len = struct.pack(">B", len(topic)) if m.version == 1 else struct.pack(">h", len(topic))
    tail = (struct.pack(">i", len(m.body)) + m.body + topic_len + topic
            + struct.pack(">h", len(props)) + props)
    size = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + len(born) + 8 + len(store) + 4 + 8 + len(tail)
    head = struct.pack(
        ">iIiiiqqiq", size, MAGIC_V1 if m.version == 1 else MAGIC_V2,
        zlib.crc32(m.body) & 0x7FFFFFFF, m.queue_id, m.flag, m.queue_offset,
        m.commitlog_offset, sys_flag, m.born_timestamp)
    out = (head + born + struct.pack(">q", m.store_timestamp) + store
           + struct.pack(">iq", m.reconsume_times, m.prepared_transaction_offset) + tail)
    assert len(out) == size
    return out


class GoldenStore:
    """Writes a store directory: commitlog segments of ``segment_size`` bytes and consume
    queues, appending records exactly as RocketMQ's append callback decides."""

    def __init__(self, root: str, segment_size: int = 16 * 1024, cq_file_entries: int = 50) -> None:
        self.root = root
        self.segment_size = segment_size
        self.cq_file_size = cq_file_entries * 20
        self.messages: list[GoldenMessage] = []
        self.segments: dict[int, bytearray] = {0: bytearray(segment_size)}
        self.pos = 0  # write position in the last segment
        self.base = 0
        self.queue_offsets: dict[tuple, int] = {}
        self.cq: dict[tuple, bytearray] = {}

    @property
    def end(self) -> int:
        return self.base + self.pos

    def append(self, m: GoldenMessage) -> GoldenMessage:
        key = (m.topic, m.queue_id)
        m.queue_offset = self.queue_offsets.get(key, 0) if m.dispatched else 0
        m.commitlog_offset = self.base + self.pos
        data = encode(m)
        if len(data) + 8 > self.segment_size - self.pos:
            # blank record: TOTALSIZE = rest of the segment, magic BLANK; then roll
            seg = self.segments[self.base]
            struct.pack_into(">iI", seg, self.pos, self.segment_size - self.pos, BLANK)
            self.base += self.segment_size
            self.pos = 0
            self.segments[self.base] = bytearray(self.segment_size)
            m.commitlog_offset = self.base
            data = encode(m)
        m.size = len(data)
        self.segments[self.base][self.pos : self.pos + len(data)] = data
        self.pos += len(data)
        if m.dispatched:
            self.queue_offsets[key] = m.queue_offset + 1
            tags = dict(m.properties).get("TAGS")
            self.cq.setdefault(key, bytearray()).extend(
                CQ_ENTRY.pack(m.commitlog_offset, m.size, java_hash(tags) if tags else 0))
        self.messages.append(m)
        return m

    def write(self, *, preallocate_next: bool = True) -> str:
        """Write the files (every segment at full size; a preallocated empty next segment
        like RocketMQ's allocator keeps ready)."""
        cl = os.path.join(self.root, "commitlog")
        os.makedirs(cl, exist_ok=True)
        segments = dict(self.segments)
        if preallocate_next:
            segments.setdefault(self.base + self.segment_size, bytearray(self.segment_size))
        for base, data in segments.items():
            with open(os.path.join(cl, f"{base:020d}"), "wb") as f:
                f.write(data)
        for (topic, qid), entries in self.cq.items():
            d = os.path.join(self.root, "consumequeue", topic, str(qid))
            os.makedirs(d, exist_ok=True)
            for start in range(0, max(len(entries), 1), self.cq_file_size):
                chunk = bytes(entries[start : start + self.cq_file_size])
                with open(os.path.join(d, f"{start:020d}"), "wb") as f:
                    f.write(chunk + bytes(self.cq_file_size - len(chunk)))
        return self.root


def build_golden_store(root: str) -> GoldenStore:
    """A store exercising the format's corners (about 20 segments of 16 KiB)."""
    g = GoldenStore(root)
    ts = 1_700_000_000_000
    topics = ["GoldenA", "GoldenB", "Gölden-ü"]
    for i in range(600):
        topic = topics[i % 3]
        props = []
        if i % 5:
            props.append(("TAGS", f"tag{i % 7}"))
        if i % 4 == 0:
            props.append(("KEYS", f"k{i} order-{i // 2}"))
        elif i % 4 == 1:
            props.append(("KEYS", f" lone{i}  "))
        props.append(("UNIQ_KEY", f"C0A8000A{i:024X}"))
        if i % 9 == 0:
            props.append(("note", "käse\x01mit\x01trennern"))  # value holding \x01
        if i % 11 == 0:
            props.append(("empty", ""))  # dropped by the parser
        m = GoldenMessage(
            topic=topic, body=bytes((i * 31 + j) % 256 for j in range((i * 37) % 700)),
            queue_id=i % 4, properties=props, trailing_separator=bool(i % 2),
            flag=i % 3, born_timestamp=ts + i * 1000 - 5, store_timestamp=ts + i * 1000,
            born_host="[2001:db8::7]:40000" if i % 13 == 0 else f"192.168.0.{10 + i % 3}:{51000 + i}",
            store_host="[fe80::1]:10911" if i % 17 == 0 else "10.1.2.3:10911",
            reconsume_times=i % 2,
        )
        if i % 50 == 7:
            m.sys_flag = 0x4  # PREPARED: stored, not dispatched, queue offset 0
            m.prepared_transaction_offset = 0
        if i % 50 == 8:
            m.sys_flag = 0x8  # COMMIT
            m.prepared_transaction_offset = 123
        if i == 300:
            m.topic = "T" * 140  # longer than 127 bytes: a v2 record
            m.version = 2
        g.append(m)
    return g
