"""Both HA transports keep the promises of ``HATransport`` (store/ha/transfer.py).

The master's connection and the slave's client are written once against ``HATransport``;
the timer tests run them on ``StreamTransport`` (memory streams, autojump clock) and
production runs them on ``SocketTransport`` (TCP, zero-copy paths). Each test here holds
every transport to one promise of the protocol, so that what the memory-stream tests show is
what a TCP peer gets: the bytes, in order, and nothing more; what a non-blocking call took
is what the peer sees; a peer's close is an empty read (or 0); cancellation before any byte.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator

import pytest
import trio
import trio.testing

from trio_ha.store.ha.transfer import (
    SENDFILE_MIN_BYTES,
    SPLICE_MIN_BYTES,
    HATransport,
    SocketTransport,
    StreamTransport,
)
from trio_ha.store.segment import Segment

#: the transports, and how each is built: over TCP with either send method, and a plain
#: trio Stream (memory streams, and a TCP stream taken as any Stream)
KINDS = ["socket-send", "socket-sendfile", "stream-memory", "stream-tcp"]
SEGMENT_SIZE = 4 << 20


@contextlib.asynccontextmanager
async def tcp_pair() -> AsyncIterator[tuple[trio.SocketStream, trio.SocketStream]]:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    try:
        port = listeners[0].socket.getsockname()[1]
        client = await trio.open_tcp_stream("127.0.0.1", port)
        server = await listeners[0].accept()
    finally:
        for listener in listeners:
            await listener.aclose()
    try:
        yield server, client
    finally:
        await client.aclose()
        await server.aclose()


@contextlib.asynccontextmanager
async def transport_pair(kind: str) -> AsyncIterator[tuple[HATransport, trio.abc.Stream]]:
    """A transport of ``kind``, and the peer's end of its stream."""
    if kind == "stream-memory":
        ours, theirs = trio.testing.memory_stream_pair()
        transport = StreamTransport(ours)
        try:
            yield transport, theirs
        finally:
            await transport.aclose()
            await theirs.aclose()
        return
    async with tcp_pair() as (ours, theirs):
        transport: HATransport
        if kind == "stream-tcp":
            transport = StreamTransport(ours, "tcp")
        else:
            transport = SocketTransport(ours, method=kind.removeprefix("socket-"))
        try:
            yield transport, theirs
        finally:
            await transport.aclose()


@pytest.fixture(params=KINDS)
def kind(request) -> str:
    return request.param


@pytest.fixture
def segment(tmp_path):
    segment = Segment.create(str(tmp_path), 0, SEGMENT_SIZE, warm=False)
    body = os.urandom(1 << 20)
    segment.write(0, body)
    segment.wrote_position = len(body)
    yield segment
    segment.close()


async def receive_exactly(stream: trio.abc.Stream, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = await stream.receive_some(size - len(data))
        assert chunk, f"the stream ended after {len(data)} of {size} bytes"
        data += chunk
    return bytes(data)


async def test_it_names_its_peer_and_starts_with_nothing_spliced(kind):
    async with transport_pair(kind) as (transport, _):
        assert isinstance(transport.peer, str) and transport.peer
        assert transport.bytes_spliced == 0


@pytest.mark.parametrize("size", [100, SENDFILE_MIN_BYTES + 1000])
async def test_a_frame_arrives_as_its_header_then_the_segments_bytes(kind, segment, size):
    header = b"H" * 12
    async with transport_pair(kind) as (transport, peer), trio.open_nursery() as nursery:
        received: list[bytes] = []

        async def read() -> None:
            received.append(await receive_exactly(peer, 2 * (len(header) + size)))

        nursery.start_soon(read)
        with segment.hold():
            await transport.send_frame(header, segment, 10, 10 + size)
            await transport.send_frame(header, segment, 10 + size, 10 + 2 * size)
    assert received == [header + segment.read(10, size) + header + segment.read(10 + size, size)]


async def test_send_all_delivers_the_bytes_in_order(kind):
    data = os.urandom(300_000)
    async with transport_pair(kind) as (transport, peer), trio.open_nursery() as nursery:
        received: list[bytes] = []

        async def read() -> None:
            received.append(await receive_exactly(peer, 2 * len(data)))

        nursery.start_soon(read)
        await transport.send_all(data)
        await transport.send_all(data[::-1])
    assert received == [data + data[::-1]]


@pytest.mark.parametrize("size", [100, SENDFILE_MIN_BYTES + 1000])
async def test_what_a_nonblocking_frame_send_took_is_what_the_peer_gets(kind, segment, size):
    header = b"h" * 12
    async with transport_pair(kind) as (transport, peer):
        with segment.hold():
            taken = transport.send_frame_nowait(header, segment, 0, size)
        assert 0 <= taken <= len(header) + size
        if taken:
            assert await receive_exactly(peer, taken) == (header + segment.read(0, size))[:taken]
        # Nothing more was sent: the next bytes the peer sees are these.
        await transport.send_all(b"after")
        assert await receive_exactly(peer, 5) == b"after"


async def test_what_a_nonblocking_send_took_is_what_the_peer_gets(kind):
    data = os.urandom(1000)
    async with transport_pair(kind) as (transport, peer):
        taken = transport.send_nowait(data)
        assert 0 <= taken <= len(data)
        await transport.send_all(data[taken:])
        assert await receive_exactly(peer, len(data)) == data


async def test_receive_some_returns_the_peers_bytes_then_empty_once_it_closed(kind):
    async with transport_pair(kind) as (transport, peer):
        await peer.send_all(b"report!!" * 3)
        data = bytearray()
        while len(data) < 24:
            chunk = await transport.receive_some(10)
            assert 0 < len(chunk) <= 10
            data += chunk
        assert data == b"report!!" * 3
        await peer.aclose()
        assert await transport.receive_some(10) == b""


async def test_receive_eagerly_says_before_it_waits(kind):
    async with transport_pair(kind) as (transport, peer), trio.open_nursery() as nursery:
        waits: list[bool] = []
        received: list[bytes] = []

        async def read() -> None:
            received.append(bytes(await transport.receive_eagerly(8, lambda: waits.append(True))))

        nursery.start_soon(read)
        await trio.testing.wait_all_tasks_blocked()
        assert waits and not received  # nothing was there: it said so, then waited
        await peer.send_all(b"12345678")
    assert received == [b"12345678"]


async def test_receive_eagerly_looks_at_cancellation_before_it_takes_a_byte(kind):
    async with transport_pair(kind) as (transport, peer):
        await peer.send_all(b"kept")
        await trio.testing.wait_all_tasks_blocked()
        with trio.CancelScope() as scope:
            scope.cancel()
            await transport.receive_eagerly(4, lambda: None)
        assert scope.cancelled_caught
        assert await transport.receive_eagerly(4, lambda: None) == b"kept"


@pytest.mark.parametrize("size", [100, SPLICE_MIN_BYTES * 4])
async def test_a_body_received_into_a_segment_lands_at_its_place(kind, segment, size):
    body = os.urandom(size)
    start = segment.wrote_position
    async with transport_pair(kind) as (transport, peer), trio.open_nursery() as nursery:
        nursery.start_soon(peer.send_all, body)
        at = start
        while at < start + size:
            received = await transport.receive_into_segment_eagerly(
                segment, at, start + size, size, lambda: None)
            assert 0 < received <= start + size - at
            at += received
        assert segment.read(start, size) == body
        await peer.aclose()
        # The peer closed: 0 bytes, and the segment is untouched past the body.
        assert await transport.receive_into_segment_eagerly(
            segment, at, at + size, size, lambda: None) == 0


async def test_after_aclose_the_peer_sees_the_end(kind):
    async with transport_pair(kind) as (transport, peer):
        await transport.send_all(b"bye")
        await transport.aclose()
        assert await receive_exactly(peer, 3) == b"bye"
        assert await peer.receive_some(10) == b""
