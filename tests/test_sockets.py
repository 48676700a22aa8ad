"""``receive_now``: trio's receive_some-in-move_on_at, without its layers (issue 11).

The remoting server and client and the HA master read every socket through it, so each
promise of the stream it stands in for is pinned here on a real socket pair: bytes, the
peer's end, the deadline (also when bytes are waiting), cancellation before any byte is
taken, and a socket closed before or during the read.
"""

from __future__ import annotations

import math
import socket

import pytest
import trio
import trio.testing

from trio_ha._sockets import receive_from, receive_now


def socket_pair() -> tuple[trio.socket.SocketType, socket.socket]:
    ours, theirs = socket.socketpair()
    return trio.socket.from_stdlib_socket(ours), theirs


async def test_bytes_waiting_come_back_after_a_yield():
    ours, theirs = socket_pair()
    with ours, theirs:
        theirs.sendall(b"hello")
        with trio.testing.assert_checkpoints():
            assert await receive_now(ours, 3) == b"hel"
        assert await receive_now(ours, 100, trio.current_time() + 10) == b"lo"


@pytest.mark.parametrize("timeout", [math.inf, 10.0])
async def test_waits_for_bytes_then_returns_them(timeout, autojump_clock):
    ours, theirs = socket_pair()
    with ours, theirs:
        async with trio.open_nursery() as nursery:
            async def send_later() -> None:
                await trio.sleep(0.05)
                theirs.sendall(b"late")
            nursery.start_soon(send_later)
            assert await receive_now(ours, 100, trio.current_time() + timeout) == b"late"


async def test_the_peers_end_is_empty_bytes():
    ours, theirs = socket_pair()
    with ours:
        theirs.sendall(b"last")
        theirs.close()
        assert await receive_now(ours, 100) == b"last"
        assert await receive_now(ours, 100) == b""


async def test_nothing_by_the_deadline_is_none(autojump_clock):
    ours, theirs = socket_pair()
    with ours, theirs:
        start = trio.current_time()
        assert await receive_now(ours, 100, start + 5) is None
        assert trio.current_time() == pytest.approx(start + 5)


async def test_a_passed_deadline_wins_over_bytes_waiting():
    """As move_on_at: a peer that always has one more byte ready still meets its timeout,
    and the byte stays in the socket for whoever reads next."""
    ours, theirs = socket_pair()
    with ours, theirs:
        theirs.sendall(b"x")
        assert await receive_now(ours, 100, trio.current_time() - 1) is None
        assert await receive_now(ours, 100) == b"x"


async def test_cancelled_before_reading_takes_no_byte():
    ours, theirs = socket_pair()
    with ours, theirs:
        theirs.sendall(b"keep")
        with trio.CancelScope() as scope:
            scope.cancel()
            await receive_now(ours, 100)
        assert scope.cancelled_caught
        assert await receive_now(ours, 100) == b"keep"


async def test_a_socket_closed_before_the_read_is_refused_not_read():
    """Its descriptor number may be another socket's by now: never read it."""
    ours, theirs = socket_pair()
    with theirs:
        ours.close()
        with pytest.raises(trio.ClosedResourceError):
            await receive_now(ours, 100)


@pytest.mark.parametrize("timeout", [math.inf, 10.0])
async def test_a_socket_closed_while_waiting_wakes_the_reader(timeout, autojump_clock):
    ours, theirs = socket_pair()
    with theirs:
        async with trio.open_nursery() as nursery:
            async def close_soon() -> None:
                await trio.sleep(0.05)
                ours.close()
            nursery.start_soon(close_soon)
            with pytest.raises(trio.ClosedResourceError):
                await receive_now(ours, 100, trio.current_time() + timeout)


async def test_a_reset_is_an_os_error():
    """A peer that closes with our bytes unread resets the connection: the error is the
    OSError a trio socket raises, which every reader handles as a lost connection."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        client = trio.socket.socket()
        with client:
            await client.connect(listener.getsockname())
            server, _ = listener.accept()
            await client.send(b"never read")  # on loopback, in server's buffer on return
            server.close()  # unread bytes in its buffer: the kernel answers with a reset
            with pytest.raises(ConnectionResetError):
                await receive_now(client, 100, trio.current_time() + 10)


async def test_a_stream_that_is_not_a_socket_is_read_through_its_receive_some():
    """TLS and memory streams: the same answers through the stream's own receive."""
    ours, theirs = trio.testing.memory_stream_pair()
    await theirs.send_all(b"tls")
    assert await receive_from(ours, 100, trio.current_time() + 10) == b"tls"
    assert await receive_from(ours, 100, trio.current_time() - 1) is None
    await theirs.aclose()
    assert await receive_from(ours, 100) == b""
