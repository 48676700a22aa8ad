"""Frames: how commands are cut out of a byte stream and put back into one.

Every broker and name server request and response is one frame (docs/remoting.md, 'Frame')::

    total length L:4 | serialize type:1, header length H:3 | header:H | body:L-4-H

where L counts everything after itself. The header is one of the two encodings of
``serialize``; the body is opaque bytes.

The peer is untrusted. ``FrameDecoder`` checks the declared lengths as soon as it has read
them, before it buffers the frame (a length of 0x7FFFFFFF fails after 4 bytes, not after
2 GiB), and raises ``RemotingDecodeError`` and nothing else. After an error the decoder stays
broken: the stream has lost its framing and the connection must close.

Like ``wire.ha`` this is sans-I/O in the h11 style: ``receive_data(bytes)``, then
``next_command()`` until it returns ``NEED_DATA``. On the way out, ``encode`` builds a frame
with one join, and ``encode_head`` lets a pump send a large body (a pull response made of
mapped commitlog slices) after the head without copying it at all.
"""

from __future__ import annotations

import struct

import attrs

from ..errors import RemotingDecodeError
from ..ha import NEED_DATA, NeedData
from .codes import SerializeType
from .command import RemotingCommand
from .serialize import (
    decode_binary_header,
    decode_json_header,
    encode_binary_header,
    encode_json_header,
)

__all__ = [
    "MAX_FRAME_LENGTH",
    "MAX_HEADER_LENGTH",
    "NEED_DATA",
    "FrameDecoder",
    "MappedReply",
    "NeedData",
    "decode_frame",
    "encode",
    "encode_head",
    "encode_parts",
]

#: ``com.rocketmq.remoting.frameMaxLength``: Netty's frame limit, which counts the 4-byte
#: length field too, so the largest total length L is this minus 4.
MAX_FRAME_LENGTH = 16 * 1024 * 1024
#: our limit on a header (Java has none beyond the frame); 1 MiB is far above any real header
MAX_HEADER_LENGTH = 1024 * 1024

_FRAME_HEAD = struct.Struct(">iI")  # total length, serialize type << 24 | header length
_LENGTH = struct.Struct(">i")
_SERIALIZE_TYPES = {member.value: member for member in SerializeType}


def encode_head(command: RemotingCommand, body_length: int | None = None, *,
                opaque: int | None = None) -> bytes:
    """The frame up to the body: length words and header. The caller sends ``body_length``
    bytes of body next (default: ``len(command.body)``), e.g. straight from mapped segments.
    ``opaque``, if given, replaces the command's (a client numbers requests as it sends them,
    without making a new command for each)."""
    if command.serialize_type == SerializeType.ROCKETMQ:
        header = encode_binary_header(command, opaque)
    else:
        header = encode_json_header(command, opaque)
    if body_length is None:
        body_length = len(command.body)
    return frame_head(header, command.serialize_type, body_length)


def frame_head(header: bytes, serialize_type: SerializeType, body_length: int) -> bytes:
    """The length words and ``header`` (already encoded in ``serialize_type``) of a frame
    whose ``body_length`` bytes of body follow. Raises ValueError past the remoting limits."""
    total = 4 + len(header) + body_length
    if len(header) > 0xFFFFFF or total + 4 > MAX_FRAME_LENGTH:
        raise ValueError(
            f"frame of {total + 4} bytes (header {len(header)}) exceeds the remoting limits"
        )
    return _FRAME_HEAD.pack(total, (serialize_type.value << 24) | len(header)) + header


def encode(command: RemotingCommand, *, opaque: int | None = None) -> bytes:
    """The whole frame, as one bytes object (one copy of the body); ``opaque`` as in
    ``encode_head``."""
    body = command.body
    if not body:
        return encode_head(command, 0, opaque=opaque)
    return encode_head(command, len(body), opaque=opaque) + body


@attrs.frozen
class MappedReply:
    """A response whose body is buffers sent as they are — views of mapped segments (a pull's
    records) — instead of ``command.body``: the body goes from the mapping to the socket
    without a copy (``encode_parts``)."""

    command: RemotingCommand
    body: tuple[memoryview, ...]

    @property
    def body_length(self) -> int:
        return sum(len(part) for part in self.body)


def encode_parts(reply: MappedReply) -> list[bytes | memoryview]:
    """The frame of ``reply`` as buffers to write in order: the head, then the body's views."""
    return [encode_head(reply.command, reply.body_length), *reply.body]


@attrs.define(eq=False)
class FrameDecoder:
    """Decodes a stream of frames. Feed it with ``receive_data``; call ``next_command`` until
    it returns ``NEED_DATA``. Raises ``RemotingDecodeError``; after that every call raises
    again (the stream has lost its framing: close the connection). Compared by identity: it
    is one connection's live state, not a value."""

    max_frame_length: int = MAX_FRAME_LENGTH
    max_header_length: int = MAX_HEADER_LENGTH
    _buffer: bytearray = attrs.field(factory=bytearray)
    _pos: int = 0  # start of the unconsumed bytes in _buffer
    _error: RemotingDecodeError | None = None

    #: consumed bytes are dropped from the front of the buffer once there are at least this
    #: many and they are at least half of it: amortised O(1) per byte, never O(n^2)
    COMPACT_AT = 64 * 1024

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as commands."""
        return len(self._buffer) - self._pos

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        if self._error is not None:
            raise self._broken()
        self._buffer += data

    def next_command(self) -> RemotingCommand | NeedData:
        if self._error is not None:
            raise self._broken()
        try:
            return self._next()
        except RemotingDecodeError as exc:
            self._error = exc
            self._buffer = bytearray()
            self._pos = 0
            raise

    def _broken(self) -> RemotingDecodeError:
        return RemotingDecodeError(f"the frame decoder failed earlier: {self._error}")

    def _next(self) -> RemotingCommand | NeedData:
        buf = self._buffer
        pos = self._pos
        available = len(buf) - pos
        if available < 4:
            return NEED_DATA
        (total,) = _LENGTH.unpack_from(buf, pos)
        # Netty's limit counts the length field: L + 4 <= max
        if total <= 4 or total > self.max_frame_length - 4:
            raise RemotingDecodeError(
                f"frame length {total} is out of range (5..{self.max_frame_length - 4})"
            )
        if available < 8:
            return NEED_DATA
        (word,) = _LENGTH.unpack_from(buf, pos + 4)
        stype = (word >> 24) & 0xFF
        header_len = word & 0xFFFFFF
        serialize_type = _SERIALIZE_TYPES.get(stype)
        if serialize_type is None:
            raise RemotingDecodeError(f"unknown serialize type {stype}")
        if header_len == 0 or header_len > total - 4:
            raise RemotingDecodeError(
                f"header length {header_len} does not fit a frame of length {total}"
            )
        if header_len > self.max_header_length:
            raise RemotingDecodeError(
                f"header length {header_len} exceeds the limit of {self.max_header_length}"
            )
        end = pos + 4 + total
        if len(buf) < end:
            return NEED_DATA
        header_start = pos + 8
        body_start = header_start + header_len
        if serialize_type is SerializeType.JSON:
            with memoryview(buf) as view:
                header = bytes(view[header_start:body_start])
            fields = decode_json_header(header)
        else:
            fields = decode_binary_header(buf, header_start, body_start)
        if body_start < end:
            with memoryview(buf) as view:
                body = bytes(view[body_start:end])
        else:
            body = b""
        # consume the frame
        if end == len(buf):
            buf.clear()
            self._pos = 0
        elif end >= self.COMPACT_AT and end * 2 >= len(buf):
            del buf[:end]
            self._pos = 0
        else:
            self._pos = end
        code, language, version, opaque, flag, remark, ext = fields
        return RemotingCommand(
            code, language, version, opaque, flag, remark, ext, body, serialize_type
        )


def decode_frame(frame: bytes | bytearray | memoryview) -> RemotingCommand:
    """Decode exactly one complete frame (with its leading length)."""
    decoder = FrameDecoder()
    decoder.receive_data(frame)
    command = decoder.next_command()
    if command is NEED_DATA:
        raise RemotingDecodeError(f"incomplete frame ({len(frame)} bytes)")
    if decoder.buffered:
        raise RemotingDecodeError(f"{decoder.buffered} bytes after the frame")
    return command
