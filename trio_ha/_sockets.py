"""Small socket facts shared by the network layers (HA and remoting)."""

from __future__ import annotations

import fcntl
import math
import os
import socket
import struct
from collections.abc import Sequence

import trio

Buffers = Sequence[bytes | memoryview]


async def listen_named(port: int, host: str | None, what: str) -> list[trio.SocketListener]:
    """Listeners on ``host:port``. A failure is an OSError (errno kept) that names the address
    and which port it is (``listenPort``, ``haListenPort``...): an operator's "address in use"
    must say which of a node's ports is taken."""
    try:
        return await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot listen on {host or '*'}:{port}, {what}: "
                                 f"{exc.strerror or exc}") from exc


#: SIOCGIFADDR (Linux): an interface's IPv4 address
_SIOCGIFADDR = 0x8915


def local_address() -> str:
    """This host's address for others to reach it, chosen as RocketMQ's
    ``RemotingUtil.getLocalAddress`` does: the IPv4 addresses of the interfaces that are not
    loopback and not bridges, the first not in 127.0/192.168 if any, else the last; loopback
    when there is none."""
    found = []
    try:
        interfaces = socket.if_nameindex()
    except OSError:  # pragma: no cover - no interface list on this platform
        interfaces = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in interfaces:
            if os.path.exists(f"/sys/class/net/{name}/bridge"):
                continue
            try:
                request = struct.pack("256s", name.encode()[:15])
                answer = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, request)
            except OSError:  # no IPv4 address on it, or down
                continue
            address = socket.inet_ntoa(answer[20:24])
            if not address.startswith("127."):
                found.append(address)
    for address in found:
        if not address.startswith(("127.0", "192.168")):
            return address
    return found[-1] if found else "127.0.0.1"


def peer_name(sock: socket.socket | trio.socket.SocketType) -> str:
    """``host:port`` of the peer, or a placeholder: a peer that already reset its connection
    makes getpeername fail, and that must cost only that connection, never the server."""
    try:
        host, port = sock.getpeername()[:2]
    except OSError:
        return "<disconnected peer>"
    return f"{host}:{port}"


def peer_host(peer: str) -> str:
    """The host of a ``host:port`` that ``peer_name`` made (IPv6 without brackets): what
    whitelists match, and what a peer's log lines are limited by."""
    return peer.rpartition(":")[0].strip("[]")


def socket_fd(stream: trio.abc.Stream) -> int:
    """The descriptor of ``stream``'s socket for a write of one's own (``write_now``), or -1
    when it is not a trio socket stream (a memory stream in tests, TLS)."""
    return stream.socket.fileno() if isinstance(stream, trio.SocketStream) else -1


async def receive_now(sock: trio.socket.SocketType, size: int,
                      deadline: float = math.inf) -> bytes | None:
    """Up to ``size`` bytes from a connected trio socket (``b""`` once the peer has closed),
    or None when ``deadline`` passes first with nothing received.

    It is ``trio.SocketStream.receive_some`` inside ``trio.move_on_at(deadline)``, the same
    checkpoints included: cancellation is looked at before reading, and bytes that were
    waiting come back after a yield. What it leaves out is the layers between: a conflict
    detector, the socket method's wrapper, the try-sync async context manager, and a cancel
    scope with a deadline armed and disarmed on every read, which cost more than the read's
    other work (docs/performance.md, *Small costs*). Bytes already waiting, the common case under
    load, are read with one syscall and no deadline at all; only a read that must wait arms one.

    A deadline that has passed returns None at once, bytes waiting or not, as
    ``move_on_at`` would (a peer that trickles a frame in byte by byte still meets its
    request timeout). A socket closed under it raises ``trio.ClosedResourceError``, before
    it reads (its descriptor may be another's by then) or while it waits; a socket error is
    the OSError, as a trio socket raises it."""
    await trio.lowlevel.checkpoint_if_cancelled()
    if deadline != math.inf and deadline <= trio.current_time():
        return None  # as move_on_at: a passed deadline wins over bytes waiting
    fd = sock.fileno()
    if fd < 0:
        raise trio.ClosedResourceError("the socket was closed")
    try:
        data = os.read(fd, size)
    except BlockingIOError:
        pass
    else:
        await trio.lowlevel.cancel_shielded_checkpoint()
        return data
    if deadline == math.inf:
        return await _wait_and_receive(sock, size)  # no deadline, no cancel scope to arm
    with trio.move_on_at(deadline):
        return await _wait_and_receive(sock, size)
    return None


async def _wait_and_receive(sock: trio.socket.SocketType, size: int) -> bytes:
    while True:
        await trio.lowlevel.wait_readable(sock)
        fd = sock.fileno()
        if fd < 0:
            raise trio.ClosedResourceError("the socket was closed")
        try:
            return os.read(fd, size)
        except BlockingIOError:
            continue  # woken for nothing (a spurious wake-up)


async def receive_from(stream: trio.abc.ReceiveStream, size: int,
                       deadline: float = math.inf) -> bytes | bytearray | None:
    """``receive_now`` when ``stream`` is a plain socket; otherwise (TLS, memory streams in
    tests) the stream's ``receive_some`` within ``deadline``. None when the deadline passed."""
    if isinstance(stream, trio.SocketStream):
        return await receive_now(stream.socket, size, deadline)
    with trio.move_on_at(deadline):
        return await stream.receive_some(size)
    return None


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
