"""Runs the authentication handshake of ``trio_ha.wire.ha_auth`` on an HA transport: the
master's side (``authenticate_slave``) and the slave's (``authenticate_master``).

Each side binds the exchange to the connection's addresses as its own socket sees them
(``connection_endpoint``): the slave proves the address it is connected to, and the master
wants that to be the address the connection reached it at, so a relay cannot pass.

Both bound the whole exchange by HANDSHAKE_TIMEOUT (the caller's scope) and read no more than
the handshake's own bytes: neither side sends anything else until the exchange is done, so
nothing of the classic protocol is read here by mistake. The master checks the MAGIC as soon
as the first bytes arrive, so a classic slave (which opens with its 8-byte offset) is turned
away at once instead of after the timeout.
"""

from __future__ import annotations

import secrets
from typing import Literal

from ...wire.ha_auth import (
    HELLO_SIZE,
    MAGIC,
    MASTER_PROOF_SIZE,
    NO_ENDPOINT,
    NONCE_SIZE,
    SLAVE_ANSWER_SIZE,
    HAAuthError,
    check_master_proof,
    check_slave_answer,
    endpoint,
    hello,
    master_proof,
    read_hello,
    slave_answer,
)
from .transfer import HATransport, SocketTransport

__all__ = ["HANDSHAKE_TIMEOUT", "authenticate_master", "authenticate_slave",
           "connection_endpoint"]

#: how long either side waits for the whole handshake
HANDSHAKE_TIMEOUT = 5.0


async def _receive_exactly(transport: HATransport, size: int, *, magic: bool) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = await transport.receive_some(size - len(data))
        if not chunk:
            raise HAAuthError("the peer closed the connection during the handshake")
        data += chunk
        if magic and not MAGIC.startswith(data[:len(MAGIC)]):
            raise HAAuthError("the peer does not speak the authentication handshake (no "
                              "haAuthSecret on its side?)")
    return bytes(data)


def connection_endpoint(transport: HATransport, side: Literal["local", "peer"]) -> bytes:
    """The connection's own address (``local``: where it reached us) or its peer's, as the
    handshake carries it; ``NO_ENDPOINT`` for a transport without a socket (a memory stream)
    or an address that is not IP (both sides of such a connection see it the same way)."""
    if not isinstance(transport, SocketTransport):
        return NO_ENDPOINT
    try:
        name = (transport.sock.getsockname() if side == "local"
                else transport.sock.getpeername())
        return endpoint(name[0], name[1])
    except (OSError, ValueError, TypeError, IndexError):
        return NO_ENDPOINT


async def authenticate_slave(transport: HATransport, secret: str) -> None:
    """The master's side: challenge the peer, check its proof (and that it dialled the
    address it reached us at), prove ourselves."""
    key = secret.encode()
    nonce = secrets.token_bytes(NONCE_SIZE)
    await transport.send_all(hello(nonce))
    answer = await _receive_exactly(transport, SLAVE_ANSWER_SIZE, magic=True)
    slave = check_slave_answer(key, nonce, answer, connection_endpoint(transport, "local"))
    await transport.send_all(master_proof(key, slave.slave_nonce, nonce, slave.dialled))


async def authenticate_master(transport: HATransport, secret: str) -> None:
    """The slave's side: answer the master's challenge for the address this connection
    dialled, then check the master's proof."""
    key = secret.encode()
    master_nonce = read_hello(await _receive_exactly(transport, HELLO_SIZE, magic=True))
    nonce = secrets.token_bytes(NONCE_SIZE)
    dialled = connection_endpoint(transport, "peer")
    await transport.send_all(slave_answer(key, master_nonce, nonce, dialled))
    proof = await _receive_exactly(transport, MASTER_PROOF_SIZE, magic=False)
    check_master_proof(key, nonce, master_nonce, dialled, proof)
