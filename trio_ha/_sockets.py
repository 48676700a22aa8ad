"""Small socket facts shared by the network layers (HA and remoting)."""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence

import trio

Buffers = Sequence[bytes | memoryview]


async def listen_named(port: int, host: str, what: str) -> list[trio.SocketListener]:
    """Listeners on ``host:port``. A failure is an OSError (errno kept) that names the address
    and which port it is (``listenPort``, ``haListenPort``...): an operator's "address in use"
    must say which of a node's ports is taken."""
    try:
        return await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot listen on {host}:{port}, {what}: "
                                 f"{exc.strerror or exc}") from exc


def peer_name(sock: socket.socket | trio.socket.SocketType) -> str:
    """``host:port`` of the peer, or a placeholder: a peer that already reset its connection
    makes getpeername fail, and that must cost only that connection, never the server."""
    try:
        host, port = sock.getpeername()[:2]
    except OSError:
        return "<disconnected peer>"
    return f"{host}:{port}"


def socket_fd(stream: trio.abc.Stream) -> int:
    """The descriptor of ``stream``'s socket for a write of one's own (``write_now``), or -1
    when it is not a trio socket stream (a memory stream in tests, TLS)."""
    return stream.socket.fileno() if isinstance(stream, trio.SocketStream) else -1


def write_now(fd: int, buffers: Buffers) -> int:
    """One non-blocking gathered write of ``buffers`` to a socket: the bytes the kernel took.
    0 when the socket is full, and when it is broken: the connection's writer, which queues
    what is left, meets an error that lasts and reports it."""
    try:
        return os.writev(fd, buffers)
    except OSError:
        return 0


def unsent(buffers: Buffers, sent: int) -> list[bytes | memoryview]:
    """What is left of ``buffers`` once their first ``sent`` bytes are written (a partial
    write resumes mid-buffer, without copying)."""
    for index, part in enumerate(buffers):
        if sent < len(part):
            return [memoryview(part)[sent:], *buffers[index + 1:]]
        sent -= len(part)
    return []
