"""HA transports: how commitlog bytes move between a segment and a peer.

A TCP peer gets ``SocketTransport``, which copies nothing in Python: frame bodies leave the
master as memoryview slices of the segment's mapping (header and body in one ``sendmsg``) or by
``sendfile`` from the segment's file, and arrive on the slave with ``readv`` straight into
the slave's mapping. Which send is faster depends on the machine (here, loopback measured ~2.7
GB/s for slices and 1.3-1.5 GB/s for sendfile), so it is a config value
(``ha_transfer_method``) set from ``trio-ha bench replication``.

Any other trio Stream (memory streams in tests, TLS later) gets ``StreamTransport``, which does
the same with copies. Both are an ``HATransport``, the seam the master's connection and the
slave's client are written against, so the HA code is written once and its timers can be
tested on memory streams with trio's autojump clock.
"""

from __future__ import annotations

import errno
import functools
import os
from collections.abc import Callable
from typing import Protocol, TypeVar

import trio

from ... import _backend
from ..._sockets import peer_name, receive_now, unsent, write_now
from ..segment import Segment

_T = TypeVar("_T")

#: frames smaller than this are sent with one sendmsg even when the method is sendfile
SENDFILE_MIN_BYTES = 64 * 1024


class HATransport(Protocol):
    """How HA bytes move between a segment and the peer, whatever the stream is."""

    @property
    def peer(self) -> str:
        """The peer's address, for logs and statistics."""
        ...

    async def receive_some(self, max_bytes: int) -> bytes | bytearray:
        """Up to ``max_bytes`` bytes; empty when the peer closed."""
        ...

    async def receive_eagerly(
        self, max_bytes: int, before_wait: Callable[[], None]
    ) -> bytes | bytearray:
        """``receive_some``, but bytes that are ready come back without a scheduling round,
        and ``before_wait()`` runs before it waits for more. Cancellation is looked at
        first; the caller yields on its own now and then (see ``SocketTransport``)."""
        ...

    async def receive_into_eagerly(self, view: memoryview,
                                   before_wait: Callable[[], None]) -> int:
        """Receive into ``view`` (a slave's segment mapping) as ``receive_eagerly``
        receives: the bytes received, 0 when the peer closed."""
        ...

    def send_nowait(self, data: bytes) -> int:
        """Write what the socket takes of ``data`` now, without waiting: the bytes taken (0:
        none, or this transport cannot write without waiting)."""
        ...

    async def send_all(self, data: bytes) -> None: ...

    async def send_frame(self, header: bytes, segment: Segment, start: int, end: int) -> None:
        """Send ``header`` then ``segment[start:end)``; the caller holds the segment."""
        ...

    def send_frame_nowait(self, header: bytes, segment: Segment, start: int, end: int) -> int:
        """Write what the socket takes of ``header`` and ``segment[start:end)`` now, without
        waiting: the bytes taken (0: none, because the socket is full, or this transport
        cannot write without waiting, or the frame is one ``send_frame`` sends another way).
        The caller holds the segment and sends the rest itself."""
        ...

    async def aclose(self) -> None: ...


class SocketTransport:
    """A connected TCP socket, with the zero-copy paths."""

    def __init__(self, stream: trio.SocketStream, *, method: str = "send") -> None:
        self.stream = stream
        self.sock = stream.socket
        self.method = method
        self._fd = self.sock.fileno()

    @property
    def peer(self) -> str:
        return peer_name(self.sock)

    async def receive_some(self, max_bytes: int) -> bytes | bytearray:
        data = await receive_now(self.sock, max_bytes)
        assert data is not None  # no deadline
        return data

    # trio's socket yields a scheduling round after every receive that found bytes ready (so
    # every receive is a checkpoint). The slave receives a frame's header, then its body,
    # then reports: three rounds on the path of every SYNC_MASTER ack, for a frame that was
    # whole in the socket. These read with plain non-blocking syscalls and wait only when
    # nothing is there; the slave's receive loop yields by itself every so many bytes.

    async def receive_eagerly(
        self, max_bytes: int, before_wait: Callable[[], None]
    ) -> bytes | bytearray:
        return await self._eagerly(functools.partial(os.read, self._fd, max_bytes),
                                   before_wait)

    async def receive_into_eagerly(self, view: memoryview,
                                   before_wait: Callable[[], None]) -> int:
        return await self._eagerly(functools.partial(os.readv, self._fd, (view,)),
                                   before_wait)

    async def _eagerly(self, read: Callable[[], _T], before_wait: Callable[[], None]) -> _T:
        await trio.lowlevel.checkpoint_if_cancelled()
        while True:
            try:
                return read()
            except BlockingIOError:
                before_wait()
                await trio.lowlevel.wait_readable(self.sock)

    def send_nowait(self, data: bytes) -> int:
        return write_now(self._fd, (data,))

    async def send_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[await self.sock.send(view) :]

    def _by_sendfile(self, size: int) -> bool:
        """Whether a frame body of ``size`` bytes goes by sendfile (else one sendmsg)."""
        return self.method == "sendfile" and size >= SENDFILE_MIN_BYTES

    async def send_frame(self, header: bytes, segment: Segment, start: int, end: int) -> None:
        """Send ``header`` then ``segment[start:end)``; the caller holds the segment.

        Small frames (a SYNC_MASTER put's record, typically) go out as one sendmsg of header
        and body whatever the method: sendfile would cost a second syscall for the header.
        A frame the socket takes whole at once returns without a scheduling round (trio's
        sendmsg yields after every send); the caller yields on its own now and then."""
        if self._by_sendfile(end - start):
            await self.send_all(header)
            position = start
            while position < end:
                sent = _backend.engine.sendfile(
                    self.sock.fileno(), segment.fd, position, end - position
                )
                if sent == -errno.EAGAIN:
                    await trio.lowlevel.wait_writable(self.sock)
                elif sent < 0:
                    raise OSError(-sent, f"sendfile: {os.strerror(-sent)}")
                elif sent == 0:
                    raise BrokenPipeError("sendfile sent nothing: the peer closed")
                else:
                    position += sent
            await trio.lowlevel.checkpoint()
            return
        await trio.lowlevel.checkpoint_if_cancelled()
        parts = [header, segment.view(start, end)]
        try:
            parts = unsent(parts, write_now(self._fd, parts))
            while parts:
                parts = unsent(parts, await self.sock.sendmsg(parts))
        finally:
            # Drop every view of the mapping now: the segment cannot unmap while one lives.
            del parts

    def send_frame_nowait(self, header: bytes, segment: Segment, start: int, end: int) -> int:
        if self._by_sendfile(end - start):
            return 0  # a frame this large goes as the configured method sends it: the writer's
        parts = [header, segment.view(start, end)]
        try:
            return write_now(self._fd, parts)
        finally:
            del parts  # no view of the mapping outlives the call

    async def aclose(self) -> None:
        await self.stream.aclose()


class StreamTransport:
    """Any trio Stream; bodies are copied."""

    def __init__(self, stream: trio.abc.Stream, peer: str = "stream") -> None:
        self.stream = stream
        self._peer = peer

    @property
    def peer(self) -> str:
        return self._peer

    async def receive_some(self, max_bytes: int) -> bytes | bytearray:
        return await self.stream.receive_some(max_bytes)

    async def receive_eagerly(
        self, max_bytes: int, before_wait: Callable[[], None]
    ) -> bytes | bytearray:
        before_wait()  # a stream cannot say whether bytes are ready: as if none were
        return await self.stream.receive_some(max_bytes)

    async def receive_into_eagerly(self, view: memoryview,
                                   before_wait: Callable[[], None]) -> int:
        before_wait()
        data = await self.stream.receive_some(len(view))
        view[: len(data)] = data
        return len(data)

    def send_nowait(self, data: bytes) -> int:
        return 0

    async def send_all(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def send_frame(self, header: bytes, segment: Segment, start: int, end: int) -> None:
        await self.stream.send_all(header + segment.read(start, end - start))

    def send_frame_nowait(self, header: bytes, segment: Segment, start: int, end: int) -> int:
        return 0

    async def aclose(self) -> None:
        await self.stream.aclose()


def transport_for(stream: trio.abc.Stream, *, method: str = "send") -> HATransport:
    """The fastest transport for ``stream``."""
    if isinstance(stream, trio.SocketStream):
        return SocketTransport(stream, method=method)
    return StreamTransport(stream)
