"""What every attacker of this package shares: how it connects as a raw peer, and how it
counts what the node did to it.

Why a module of its own: an attack on any port — remoting, HA, metrics — opens TCP
connections as a peer that follows no protocol, so it cannot use the servers' clients; it
needs to connect with a small receive window (a peer that reads slowly), to send until the
node hangs up, to tell whether the node closed a connection without reading from it, and to
read exactly as many bytes as a frame says. And every attack reports the same
``AttackOutcome``, counted as it runs by a ``Tally``. Those two things are one concept: the
attacker's side of a connection, as a peer sees it.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections import Counter
from collections.abc import Mapping

import attrs
import trio

from ...wire.record import parse_host_port
from ...wire.remoting import ResponseCode

__all__ = [
    "AttackOutcome", "CONNECT_TIMEOUT", "NodeAnswer", "Tally", "close_quietly", "closed_by_node",
    "code_name", "connect_raw", "node_has_closed", "read_until_closed", "receive_exactly",
    "send_until_closed", "sorted_counts", "split_address",
]

#: how long a connect may take before it counts as refused
CONNECT_TIMEOUT = 5.0
#: Linux's tcp_info state of an open connection (any other: the node closed or reset it)
_TCP_ESTABLISHED = 1


def sorted_counts(value: Mapping[str, int]) -> dict[str, int]:
    """A tally as a dict in key order (the outcomes' converter: reports read the same)."""
    return dict(sorted(value.items()))


@attrs.frozen
class AttackOutcome:
    """What one attack sent and how the node answered, as a peer sees it."""

    attack: str
    target: str
    #: connections the attack opened (connect attempts that failed are in ``refused`` too)
    connections: int = 0
    #: frames (requests, reports) and bytes that went out whole
    frames_sent: int = 0
    bytes_sent: int = 0
    #: connections the node closed (EOF or reset) while the attack ran
    closed_by_node: int = 0
    #: connections the node closed at once, or never accepted (connection limits)
    refused: int = 0
    #: the node's answers, by what they were (response code names, "heartbeat"...)
    answers: Mapping[str, int] = attrs.field(factory=dict, converter=sorted_counts)
    seconds: float = 0.0
    note: str = ""

    def as_json(self) -> dict[str, object]:
        return attrs.asdict(self)


@attrs.define
class Tally:
    """What an attack counts while it runs; frozen into an AttackOutcome at the end."""

    attack: str
    target: str
    started: float = attrs.field(factory=time.monotonic)
    connections: int = 0
    frames_sent: int = 0
    bytes_sent: int = 0
    closed_by_node: int = 0
    refused: int = 0
    answers: Counter[str] = attrs.field(factory=Counter)
    note: str = ""

    async def connect(self, address: str, *, receive_buffer: int | None = None
                      ) -> trio.SocketStream | None:
        """A connection to ``address``, counted; None when the node refused it (counted too)."""
        try:
            stream = await connect_raw(address, receive_buffer=receive_buffer)
        except OSError:
            self.refused += 1
            return None
        self.connections += 1
        return stream

    def outcome(self) -> AttackOutcome:
        return AttackOutcome(
            self.attack, self.target, self.connections, self.frames_sent, self.bytes_sent,
            self.closed_by_node, self.refused, dict(self.answers),
            round(time.monotonic() - self.started, 3), self.note,
        )


def code_name(code: int) -> str:
    try:
        return ResponseCode(code).name
    except ValueError:
        return str(code)


def split_address(address: str) -> tuple[str, int]:
    return parse_host_port(address)


async def connect_raw(address: str, *, receive_buffer: int | None = None) -> trio.SocketStream:
    """A TCP connection to ``address`` (``host:port``). ``receive_buffer`` (SO_RCVBUF, set
    before connecting: the window is settled in the handshake) makes a peer that reads
    slowly, or not at all, fill up at once. Raises OSError (TimeoutError after
    CONNECT_TIMEOUT) when the node does not take the connection."""
    host, port = split_address(address)
    sock = trio.socket.socket()
    try:
        if receive_buffer is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        with trio.move_on_after(CONNECT_TIMEOUT):
            await sock.connect((host, port))
            return trio.SocketStream(sock)
    except BaseException:
        sock.close()
        raise
    sock.close()
    raise TimeoutError(f"connecting to {address} took more than {CONNECT_TIMEOUT:g} s")


async def close_quietly(stream: trio.abc.AsyncResource) -> None:
    with trio.CancelScope(shield=True):
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            await stream.aclose()


async def send_until_closed(stream: trio.SocketStream, data: bytes | memoryview) -> bool:
    """Send as an attacker does: True once all of ``data`` went out, False if the node
    closed the connection first."""
    try:
        await stream.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return False
    return True


def node_has_closed(stream: trio.SocketStream) -> bool:
    """Whether the node has closed (or reset) the connection, without reading from it: for a
    peer that must not read (its unread replies are the attack). Linux's TCP_INFO state."""
    try:
        info = stream.socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)
    except OSError:
        return True
    return info[0] != _TCP_ESTABLISHED


async def closed_by_node(stream: trio.SocketStream, timeout: float) -> bool:
    """Read (and drop) whatever the node sends until it closes the connection: True if it
    did (EOF or reset) within ``timeout`` seconds."""
    with trio.move_on_after(max(0.0, timeout)):
        try:
            while await stream.receive_some(65536):
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        return True
    return False


@attrs.frozen
class NodeAnswer:
    """What a node sent on a connection, and whether it closed it."""

    data: bytes
    closed: bool


async def read_until_closed(stream: trio.SocketStream, timeout: float) -> NodeAnswer:
    """Everything the node sends until it closes the connection or ``timeout`` passes."""
    received = bytearray()
    with trio.move_on_after(max(0.0, timeout)):
        try:
            while data := await stream.receive_some(65536):
                received += data
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        return NodeAnswer(bytes(received), True)
    return NodeAnswer(bytes(received), False)


async def receive_exactly(stream: trio.SocketStream, n: int, timeout: float) -> bytes:
    """``n`` bytes, or fewer if the node closed the connection or ``timeout`` passed."""
    data = bytearray()
    with trio.move_on_after(max(0.0, timeout)):
        while len(data) < n:
            try:
                chunk = await stream.receive_some(n - len(data))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                break
            if not chunk:
                break
            data += chunk
    return bytes(data)
