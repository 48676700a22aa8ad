"""The attacker that misbehaves on a remoting port (a broker's or a name server's) below the
level of requests: it does not read its replies, sends frames in part or a byte at a time,
sends frames that are not frames, opens more connections than the node serves, or leaves
with requests held or unsent.

Why these belong together: each attacks the node's connection handling — its buffers, its
timeouts, its back-pressure and its connection limit — not a request handler, so each works
on raw sockets and judges by what a peer sees of the connection (closed, refused, answered).
``connection_flood`` is the same attack on a master's HA port. What a well-formed request
can do to a broker is in ``broker``.
"""

from __future__ import annotations

import contextlib
import socket
import struct

import trio

from ...wire.errors import RemotingDecodeError
from ...wire.remoting import NEED_DATA, FrameDecoder
from ._common import (
    AttackOutcome,
    Tally,
    close_quietly,
    closed_by_node,
    code_name,
    connect_raw,
    node_has_closed,
    send_until_closed,
)

__all__ = [
    "BAD_JSON_FRAME", "POLL_INTERVAL", "abandon_long_polls", "bad_frames", "connection_flood",
    "leave_with_requests_unsent", "non_reading_clients", "partial_frames", "slowloris",
]

#: a frame whose header is not JSON: the node must close the connection
BAD_JSON_FRAME = struct.pack(">ii", 12, 8) + b"{not jso"
#: how often an attack looks whether the node closed a connection it does not read
POLL_INTERVAL = 0.05
_SEND_SLICE = 64 * 1024


async def _watch_answers(stream: trio.SocketStream, tally: Tally) -> bool:
    """Decode the node's answers into ``tally`` until the node closes the connection (True)
    or the caller cancels; a stream that stops being frames ends the watch (False)."""
    decoder = FrameDecoder()
    try:
        while data := await stream.receive_some(65536):
            decoder.receive_data(data)
            while (command := decoder.next_command()) is not NEED_DATA:
                tally.answers[code_name(command.code)] += 1
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    except RemotingDecodeError:
        tally.answers["undecodable"] += 1
        return False
    return True


async def _send_slices(stream: trio.SocketStream, data: bytes, tally: Tally) -> bool:
    """Send ``data`` in slices (views, not copies), counting the bytes that went out; False
    if the node closed the connection first."""
    with memoryview(data) as view:
        for start in range(0, len(view), _SEND_SLICE):
            piece = view[start:start + _SEND_SLICE]
            if not await send_until_closed(stream, piece):
                return False
            tally.bytes_sent += len(piece)
    return True


async def _send_filler(stream: trio.SocketStream, size: int, tally: Tally) -> bool:
    """Send ``size`` bytes of filler, one shared slice at a time (an attacker's bytes cost it
    nothing: here they cost the attacking process no memory either)."""
    filler = b"x" * _SEND_SLICE
    sent = 0
    while sent < size:
        n = min(_SEND_SLICE, size - sent)
        if not await send_until_closed(stream, filler if n == _SEND_SLICE else filler[:n]):
            return False
        sent += n
        tally.bytes_sent += n
    return True


async def _wait_closed_without_reading(stream: trio.SocketStream, deadline: float) -> bool:
    """Whether the node closed the connection by ``deadline``, looking without reading (no
    event tells: the kernel's state of the socket is all there is)."""
    with trio.move_on_at(deadline):
        while True:
            if node_has_closed(stream):
                return True
            await trio.sleep(POLL_INTERVAL)
    return False


async def non_reading_clients(address: str, requests: bytes, *, clients: int = 1,
                              receive_buffer: int = 4096, seconds: float = 15.0,
                              frames: int = 0) -> AttackOutcome:
    """``clients`` connections that pipeline ``requests`` (``frames`` of them, for the
    count) and never read a reply: the node must stop reading them (back-pressure) and close
    them once its writes make no progress. Returns once the node closed them all, or after
    ``seconds``."""
    tally = Tally("non-reading clients", address)
    deadline = trio.current_time() + seconds

    async def one() -> None:
        stream = await tally.connect(address, receive_buffer=receive_buffer)
        if stream is None:
            return
        try:
            async with trio.open_nursery() as nursery:
                async def send() -> None:
                    if await _send_slices(stream, requests, tally):
                        tally.frames_sent += frames

                nursery.start_soon(send)
                if await _wait_closed_without_reading(stream, deadline):
                    tally.closed_by_node += 1
                nursery.cancel_scope.cancel()
        finally:
            await close_quietly(stream)

    async with trio.open_nursery() as nursery:
        for _ in range(clients):
            nursery.start_soon(one)
    return tally.outcome()


async def partial_frames(address: str, *, connections: int = 6, declared: int = 4 * 1024 * 1024,
                         sent: int = 2 * 1024 * 1024, seconds: float = 15.0) -> AttackOutcome:
    """``connections`` peers each send ``sent`` bytes of a frame declared ``declared`` bytes
    long, and no more: the node must bound what it buffers for them and close them when the
    frame has not arrived within its request timeout."""
    tally = Tally("partial frames", address)
    header = b'{"code":1,"flag":0} '
    head = struct.pack(">ii", declared, len(header)) + header
    deadline = trio.current_time() + seconds

    async def send(stream: trio.SocketStream) -> None:
        if await send_until_closed(stream, head):
            tally.bytes_sent += len(head)
            await _send_filler(stream, max(0, sent - len(head)), tally)

    async def one() -> None:
        stream = await tally.connect(address)
        if stream is None:
            return
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(send, stream)
                if await closed_by_node(stream, deadline - trio.current_time()):
                    tally.closed_by_node += 1
                nursery.cancel_scope.cancel()
        finally:
            await close_quietly(stream)

    async with trio.open_nursery() as nursery:
        for _ in range(connections):
            nursery.start_soon(one)
    return tally.outcome()


async def slowloris(address: str, frame: bytes, *, interval: float = 0.05,
                    seconds: float = 10.0) -> AttackOutcome:
    """One byte of ``frame`` every ``interval`` seconds, so the connection is never idle:
    the node must close it when the frame has not arrived within its request timeout (an
    answer means the whole frame arrived first)."""
    tally = Tally("slowloris", address)
    deadline = trio.current_time() + seconds
    stream = await tally.connect(address)
    if stream is None:
        return tally.outcome()
    try:
        async with trio.open_nursery() as nursery:
            async def drip() -> None:
                for i in range(len(frame)):
                    if not await send_until_closed(stream, frame[i:i + 1]):
                        return
                    tally.bytes_sent += 1
                    await trio.sleep(interval)
                tally.frames_sent += 1

            nursery.start_soon(drip)
            with trio.move_on_at(deadline):
                if await _watch_answers(stream, tally):
                    tally.closed_by_node += 1
            nursery.cancel_scope.cancel()
    finally:
        await close_quietly(stream)
    return tally.outcome()


async def abandon_long_polls(address: str, requests: bytes, *, hold_seconds: float,
                             frames: int = 0, leave: trio.Event | None = None) -> AttackOutcome:
    """Send requests the node holds (long-polled pulls), wait ``hold_seconds`` (or until
    ``leave`` is set, if sooner), and go away: the node must cancel them rather than keep
    them until their own timeout. ``answers`` counts what was answered before the peer left
    (held requests are not)."""
    tally = Tally("abandoned long polls", address)
    stream = await tally.connect(address)
    if stream is None:
        return tally.outcome()
    try:
        if await _send_slices(stream, requests, tally):
            tally.frames_sent += frames
        with trio.move_on_after(hold_seconds):
            async with trio.open_nursery() as holding:

                async def watch() -> None:
                    if await _watch_answers(stream, tally):
                        tally.closed_by_node += 1
                    holding.cancel_scope.cancel()

                holding.start_soon(watch)
                if leave is not None:
                    await leave.wait()
                    holding.cancel_scope.cancel()
    finally:
        await close_quietly(stream)
    return tally.outcome()


async def bad_frames(address: str, *, connections: int = 50, frame: bytes = BAD_JSON_FRAME,
                     seconds: float = 10.0) -> AttackOutcome:
    """``connections`` connections, one after another, each sending ``frame`` (by default a
    header that is not JSON): the node must close each."""
    tally = Tally("bad frames", address)
    deadline = trio.current_time() + seconds
    await trio.lowlevel.checkpoint()
    for _ in range(connections):
        if trio.current_time() >= deadline:
            break
        stream = await tally.connect(address)
        if stream is None:
            continue
        try:
            if await send_until_closed(stream, frame):
                tally.frames_sent += 1
                tally.bytes_sent += len(frame)
            if await closed_by_node(stream, max(0.0, deadline - trio.current_time())):
                tally.closed_by_node += 1
        finally:
            await close_quietly(stream)
    return tally.outcome()


async def connection_flood(address: str, *, connections: int = 1000, hold_seconds: float = 1.0,
                           seconds: float = 30.0, attack: str = "connection flood"
                           ) -> AttackOutcome:
    """Open ``connections`` connections and hold them ``hold_seconds``: the node must close
    those beyond what it serves at once (``refused``) rather than leave them unanswered, and
    keep serving. All are closed before it returns."""
    tally = Tally(attack, address)
    deadline = trio.current_time() + seconds
    streams: list[trio.SocketStream] = []
    try:
        for _ in range(connections):
            if trio.current_time() >= deadline:
                break
            try:
                streams.append(await connect_raw(address))
            except OSError:
                tally.refused += 1
        tally.connections = len(streams)
        await trio.sleep(min(hold_seconds, max(0.0, deadline - trio.current_time())))
        closed = sum(node_has_closed(stream) for stream in streams)
        tally.refused += closed
        tally.closed_by_node = closed
    finally:
        for stream in streams:
            await close_quietly(stream)
    return tally.outcome()


#: the send buffer of a client that leaves with requests unsent: small, so that the node's
#: full receive window leaves bytes — and the FIN behind them — in the client's send queue
_UNSENT_SEND_BUFFER = 64 * 1024


async def leave_with_requests_unsent(address: str, requests: bytes, *, seconds: float,
                                     stall: float = 0.5, max_bytes: int = 64 * 1024 * 1024
                                     ) -> AttackOutcome:
    """Send ``requests`` (held ones: long-polled pulls) again and again until the node stops
    reading — its in-flight limit is full, its receive window shut — and no send progresses
    for ``stall`` seconds (or ``max_bytes`` went out), then hang up (shutdown for writing).
    The FIN waits in this side's send queue behind the requests the node will not take, so
    the node never sees it; its connection is ESTABLISHED, with unread bytes, held requests
    and their memory. The node must still let it go — by its idle timeout at the latest
    (``serverChannelMaxIdleTimeSeconds``): ``closed_by_node`` is 1 if it did (a reset, as it
    closes with our requests unread) within ``seconds``."""
    tally = Tally("leave with requests unsent", address)
    deadline = trio.current_time() + seconds
    stream = await tally.connect(address)
    if stream is None:
        return tally.outcome()
    try:
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _UNSENT_SEND_BUFFER)
        view = memoryview(requests)
        stalled = False
        while not stalled and tally.bytes_sent < max_bytes:  # bounded by max_bytes
            for start in range(0, len(view), _SEND_SLICE):
                piece = view[start:start + _SEND_SLICE]
                with trio.move_on_after(stall):
                    if not await send_until_closed(stream, piece):
                        tally.closed_by_node += 1
                        tally.note = "closed by the node while it was still reading"
                        return tally.outcome()
                    tally.bytes_sent += len(piece)
                    continue
                stalled = True  # (a part of this piece may have gone: not counted)
                break
            else:
                tally.frames_sent += 1  # one batch of ``requests`` went out whole
        if not stalled:
            tally.note = f"the node read all {tally.bytes_sent} bytes: it never stopped reading"
        with contextlib.suppress(OSError):
            stream.socket.shutdown(socket.SHUT_WR)  # the FIN, queued behind the unsent bytes
        if await closed_by_node(stream, deadline - trio.current_time()):
            tally.closed_by_node += 1
        elif not tally.note:
            tally.note = "still open at the attack's bound (the node's idle timeout is longer)"
    finally:
        await close_quietly(stream)
    return tally.outcome()
