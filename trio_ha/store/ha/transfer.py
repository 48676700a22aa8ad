"""HA transports: how commitlog bytes move between a segment and a peer.

A TCP peer gets ``SocketTransport``, which copies nothing in Python: frame bodies leave the
master as memoryview slices of the segment's mapping (header and body in one ``sendmsg``) or by
``sendfile`` from the segment's file. Which is faster depends on the machine, so it is a config
value (``ha_transfer_method``) set from ``trio-ha bench replication`` (docs/performance.md has
this machine's figures).

On the slave, a small frame body (a SYNC_MASTER put's record) is read with ``readv`` straight
into the segment's mapping. A large one (a catching-up slave's) is spliced, to its last byte,
from the socket through a pipe into the segment's file instead: the page cache the mapping
shares takes the bytes with no user-space copy and, above all, without a page fault per 4 KiB
on the new segment's first touch, which held a slave at well under half of raw loopback
(docs/performance.md, *Replication*). ``msync`` of the range still makes them durable: on
Linux it syncs the file's pages however they were dirtied.

Any other trio Stream (memory streams in tests, TLS later) gets ``StreamTransport``, which does
the same with copies. Both are an ``HATransport``, the seam the master's connection and the
slave's client are written against, so the HA code is written once and its timers can be
tested on memory streams with trio's autojump clock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import os
from collections.abc import Callable
from typing import Protocol, TypeVar

import trio

import trio_ha._backend as _backend

from ..._sockets import peer_name, receive_now, unsent, write_now
from ..segment import Segment

_T = TypeVar("_T")

#: frames smaller than this are sent with one sendmsg even when the method is sendfile
SENDFILE_MIN_BYTES = 64 * 1024
#: a slave receives a frame body this large or larger by splice into the segment's file
#: (smaller: one readv into the mapping, a syscall where splice takes two)
SPLICE_MIN_BYTES = 16 * 1024
#: the splice pipe's capacity: a 1 MiB frame moves in one socket-to-pipe step
SPLICE_PIPE_BYTES = 1024 * 1024


def open_splice_pipe() -> tuple[int, int]:
    """A pipe (read end, write end) for ``splice_to_file``: non-blocking, close-on-exec, of
    SPLICE_PIPE_BYTES where the system allows (past /proc/sys/fs/pipe-max-size it keeps its
    64 KiB, and a splice moves that much per step)."""
    pipe = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    with contextlib.suppress(OSError):
        fcntl.fcntl(pipe[1], fcntl.F_SETPIPE_SZ, SPLICE_PIPE_BYTES)
    return pipe


class HATransport(Protocol):
    """How HA bytes move between a segment and the peer, whatever the stream is."""

    #: body bytes received by splice into segment files (no copy through user space)
    bytes_spliced: int

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

    async def receive_into_segment_eagerly(self, segment: Segment, start: int, end: int,
                                           frame_size: int,
                                           before_wait: Callable[[], None]) -> int:
        """Receive up to ``end - start`` bytes of a frame body of ``frame_size`` bytes into
        ``segment`` at ``start`` (a slave's log end) as ``receive_eagerly`` receives: the
        bytes received, 0 when the peer closed."""
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
        #: whether large bodies are received by splice (off once the system refuses it)
        self.splice = hasattr(os, "splice")
        self.bytes_spliced = 0
        self._pipe: tuple[int, int] | None = None

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

    async def receive_into_segment_eagerly(self, segment: Segment, start: int, end: int,
                                           frame_size: int,
                                           before_wait: Callable[[], None]) -> int:
        # A large frame is spliced to its last byte: a readv of its tail into the mapping
        # would fault on a page past the bytes, and the readahead that fault starts zero-fills
        # pages ahead, which the splices after it write again (it kept a catching-up slave
        # between 0.3 and 1.0 of its speed, as it happened to start or not).
        if self.splice and frame_size >= SPLICE_MIN_BYTES:
            received = await self._splice_eagerly(segment, start, end, before_wait)
            if received is not None:
                return received
        with segment.view(start, end) as view:
            return await self._eagerly(functools.partial(os.readv, self._fd, (view,)),
                                       before_wait)

    async def _splice_eagerly(self, segment: Segment, start: int, end: int,
                              before_wait: Callable[[], None]) -> int | None:
        """Splice into the segment's file as ``_eagerly`` reads; None (and splice off for
        this connection) when the system cannot, having taken nothing from the socket."""
        await trio.lowlevel.checkpoint_if_cancelled()
        pipe = self._pipe or self._open_pipe()
        while True:
            received = _backend.engine.splice_to_file(self._fd, pipe, segment.fd, start,
                                                      end - start)
            if received >= 0:
                self.bytes_spliced += received
                return received
            if received == -errno.EAGAIN:
                before_wait()
                await trio.lowlevel.wait_readable(self.sock)
            elif received in (-errno.EINVAL, -errno.ENOSYS, -errno.EOPNOTSUPP):
                self.splice = False
                return None
            else:
                raise OSError(-received, f"splice: {os.strerror(-received)}")

    def _open_pipe(self) -> tuple[int, int]:
        self._pipe = open_splice_pipe()
        return self._pipe

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
        if self._pipe is not None:
            for fd in self._pipe:
                os.close(fd)
            self._pipe = None
        await self.stream.aclose()


class StreamTransport:
    """Any trio Stream; bodies are copied."""

    def __init__(self, stream: trio.abc.Stream, peer: str = "stream") -> None:
        self.stream = stream
        self._peer = peer
        self.bytes_spliced = 0

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

    async def receive_into_segment_eagerly(self, segment: Segment, start: int, end: int,
                                           frame_size: int,
                                           before_wait: Callable[[], None]) -> int:
        before_wait()
        data = await self.stream.receive_some(end - start)
        segment.write(start, data)
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
