"""Small socket facts shared by the network layers (HA and remoting)."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import trio


def peer_name(sock: socket.socket | trio.socket.SocketType) -> str:
    """``host:port`` of the peer, or a placeholder: a peer that already reset its connection
    makes getpeername fail, and that must cost only that connection, never the server."""
    try:
        host, port = sock.getpeername()[:2]
    except OSError:
        return "<disconnected peer>"
    return f"{host}:{port}"
