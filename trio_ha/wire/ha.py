"""RocketMQ's classic (4.9) HA protocol, as two sans-I/O state machines.

The protocol is tiny and has no framing beyond this (docs/ha-protocol.md, 'Wire format')::

    slave -> master   offset:8                      "I have everything below offset"
    master -> slave   offset:8 size:4 body:size     raw commitlog bytes at offset;
                                                    size 0 is a heartbeat

Nothing identifies the stream: both sides trust that offsets line up. So the state machines
check what the classic Java code does not — a report that goes backwards or beyond what the
master has written, a frame that does not continue where the previous one ended, sizes out of
range — and raise ``HAProtocolError`` (or its ``OffsetMismatch``), which costs the peer its
connection and never the node.

As with h11: ``receive_data(bytes)`` feeds what the socket gave, ``next_event()`` returns the
next event or ``NEED_DATA``, and the ``send_*`` methods return bytes to write. The slave side
lets its I/O adapter receive a frame body straight into the commitlog mapping (``recv_into``)
and report it with ``body_received(n)``, so the body never becomes a Python bytes object.
"""

from __future__ import annotations

import enum
import struct
from typing import Final

import attrs

from .errors import WireError
from .layout import INT64_MAX

REPORT = struct.Struct(">q")
FRAME_HEADER = struct.Struct(">qi")
#: the largest frame body we accept; RocketMQ sends at most haTransferBatchSize (32 KiB), we
#: allow batches up to this for fast catch-up
MAX_FRAME_BODY = 64 * 1024 * 1024


class HAProtocolError(WireError):
    """The peer broke the HA protocol; its connection must be closed."""


class OffsetMismatch(HAProtocolError):
    """A frame does not continue the slave's log: the two logs have diverged."""

    def __init__(self, expected: int, received: int) -> None:
        super().__init__(
            f"master sent offset {received}, slave expected {expected}: the logs diverged"
        )
        self.expected = expected
        self.received = received


class NeedData(enum.Enum):
    """The type of ``NEED_DATA``, which ``next_event()`` returns when it needs more bytes
    first (the remoting frame decoder returns it too). An enum of one member, so that a type
    checker narrows ``while (event := p.next_event()) is not NEED_DATA`` to the events."""

    NEED_DATA = "NEED_DATA"

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = NeedData.NEED_DATA


@attrs.frozen
class SlaveReport:
    """The slave holds the log below ``offset`` (its ack). The first report of a connection
    is its request: where the master should start sending (0: an empty slave)."""

    offset: int
    first: bool = False


@attrs.frozen
class FrameHeader:
    """A frame starts: ``size`` bytes of the master's log at ``offset`` follow (0: heartbeat)."""

    offset: int
    size: int

    @property
    def is_heartbeat(self) -> bool:
        return self.size == 0


@attrs.frozen
class FrameData:
    """Body bytes of the current frame that arrived in the same read as something else."""

    data: bytes


@attrs.frozen
class FrameEnd:
    """The current frame's body is complete; the slave's log now ends at ``end``."""

    offset: int
    size: int

    @property
    def end(self) -> int:
        return self.offset + self.size


@attrs.define(eq=False)
class MasterProtocol:
    """The master's side of one slave connection: decodes reports, encodes frames.
    Compared by identity: it is one connection's live state, not a value."""

    #: the master's log end; a report beyond it is a lie (RocketMQ issues #1155/#3015)
    log_end: int = 0
    max_frame_body: int = MAX_FRAME_BODY
    _buffer: bytearray = attrs.field(factory=bytearray)
    _last_report: int | None = None

    @property
    def last_report(self) -> int | None:
        return self._last_report

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        buffer = self._buffer
        if self._last_report is None:
            buffer += data  # the first report is a request: never skipped
            return
        # After the first report only the last whole report and the torn one after it can
        # matter (``next_event``): keep those bytes and drop the rest unread, so that a read
        # full of reports costs a copy of at most 15 bytes, not of the read.
        total = len(buffer) + len(data)
        keep = min(total, REPORT.size + total % REPORT.size)
        if keep <= len(data):
            buffer[:] = memoryview(data)[len(data) - keep:]
        else:
            buffer += data
            del buffer[: len(buffer) - keep]

    def next_event(self) -> SlaveReport | NeedData:
        """The next report, or NEED_DATA. After the first report of a connection, only the
        last whole report of what arrived is returned: each report restates the slave's log
        end, so one that a later one supersedes says nothing (RocketMQ's master reads the
        last complete value of a read the same way). A peer streaming reports therefore costs
        one event per read, not one per eight bytes."""
        buffer = self._buffer
        whole = len(buffer) // REPORT.size
        if not whole:
            return NEED_DATA
        first = self._last_report is None
        # The first report is a request, never skipped.
        at = 0 if first else (whole - 1) * REPORT.size
        (offset,) = REPORT.unpack_from(buffer, at)
        del buffer[: at + REPORT.size]
        if offset < 0:
            raise HAProtocolError(f"slave reported a negative offset {offset}")
        if not first and offset > self.log_end:
            # The first report is a request and may be anywhere (a slave ahead of a master
            # that lost its tail must be told so); every later one is an ack of bytes the
            # master sent, so it cannot exceed what the master has.
            raise HAProtocolError(
                f"slave reported offset {offset}, beyond the master's log end {self.log_end}"
            )
        if not first and offset < self._last_report:
            raise HAProtocolError(
                f"slave report went backwards from {self._last_report} to {offset}"
            )
        self._last_report = offset
        return SlaveReport(offset, first)

    def send_frame_header(self, offset: int, size: int) -> bytes:
        """The 12-byte header of a frame whose body (``size`` bytes of the log at ``offset``)
        the caller sends next, straight from the segment."""
        if not 0 <= size <= self.max_frame_body:
            raise ValueError(f"frame body of {size} bytes is out of range")
        if not 0 <= offset <= INT64_MAX - size:
            raise ValueError(f"frame offset {offset} is out of range")
        return FRAME_HEADER.pack(offset, size)

    def send_heartbeat(self, offset: int) -> bytes:
        return self.send_frame_header(offset, 0)


@attrs.define(eq=False)
class SlaveProtocol:
    """The slave's side: encodes reports, decodes frames, checks that they continue its log.

    ``expected`` is where the slave's log ends. An empty slave (``expected`` None) takes the
    first frame's offset as its start, as RocketMQ's does (the master starts an empty slave
    at its last segment). Compared by identity: it is one connection's live state."""

    expected: int | None = None
    max_frame_body: int = MAX_FRAME_BODY
    _buffer: bytearray = attrs.field(factory=bytearray)
    _frame: FrameHeader | None = None
    _remaining: int = 0

    @property
    def body_remaining(self) -> int:
        """Bytes of the current frame's body still to come (0 between frames)."""
        return max(0, self._remaining - len(self._buffer)) if self._frame else 0

    @property
    def bytes_wanted(self) -> int:
        """How much to read next so that nothing is read ahead: the rest of the current body
        (which the adapter may receive straight into the log), else the rest of a header."""
        if self._frame is not None:
            return max(1, self.body_remaining)
        return max(1, FRAME_HEADER.size - len(self._buffer))

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        self._buffer += data

    def body_received(self, n: int) -> None:
        """The adapter received ``n`` body bytes itself (straight into the log)."""
        if self._frame is None or self._buffer or not 0 < n <= self._remaining:
            raise RuntimeError("body_received without that much body outstanding")
        self._remaining -= n

    def next_event(self) -> FrameHeader | FrameData | FrameEnd | NeedData:
        frame = self._frame
        if frame is not None:
            if self._buffer and self._remaining:
                n = min(len(self._buffer), self._remaining)
                data = bytes(self._buffer[:n])
                del self._buffer[:n]
                self._remaining -= n
                return FrameData(data)
            if self._remaining:
                return NEED_DATA
            self._frame = None
            self.expected = frame.offset + frame.size
            return FrameEnd(frame.offset, frame.size)
        if len(self._buffer) < FRAME_HEADER.size:
            return NEED_DATA
        offset, size = FRAME_HEADER.unpack_from(self._buffer)
        if size < 0 or size > self.max_frame_body:
            raise HAProtocolError(f"frame body size {size} is out of range")
        if offset < 0 or offset > INT64_MAX - size:
            raise HAProtocolError(f"frame offset {offset} is out of range")
        if self.expected is not None and offset != self.expected:
            raise OffsetMismatch(self.expected, offset)
        del self._buffer[: FRAME_HEADER.size]
        if self.expected is None and size == 0:
            # A heartbeat does not fix where an empty slave starts; only data does.
            return FrameHeader(offset, 0)
        self._frame = FrameHeader(offset, size)
        self._remaining = size
        if size == 0:
            self._frame = None
            self.expected = offset
        return FrameHeader(offset, size)

    def send_report(self, offset: int) -> bytes:
        if not 0 <= offset <= INT64_MAX:
            raise ValueError(f"offset {offset} is out of range")
        return REPORT.pack(offset)
