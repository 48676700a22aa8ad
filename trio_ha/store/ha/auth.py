"""Runs the authentication handshake of ``trio_ha.wire.ha_auth`` on an HA transport: the
master's side (``authenticate_slave``) and the slave's (``authenticate_master``).

Both bound the whole exchange by HANDSHAKE_TIMEOUT (the caller's scope) and read no more than
the handshake's own bytes: neither side sends anything else until the exchange is done, so
nothing of the classic protocol is read here by mistake. The master checks the MAGIC as soon
as the first bytes arrive, so a classic slave (which opens with its 8-byte offset) is turned
away at once instead of after the timeout.
"""

from __future__ import annotations

import secrets

from ...wire.ha_auth import (
    HELLO_SIZE,
    MAGIC,
    MASTER_PROOF_SIZE,
    NONCE_SIZE,
    SLAVE_ANSWER_SIZE,
    HAAuthError,
    check_master_proof,
    check_slave_answer,
    hello,
    master_proof,
    read_hello,
    slave_answer,
)
from .transfer import HATransport

__all__ = ["HANDSHAKE_TIMEOUT", "authenticate_master", "authenticate_slave"]

#: how long either side waits for the whole handshake
HANDSHAKE_TIMEOUT = 5.0


async def _receive_exactly(transport: HATransport, size: int, *, magic: bool) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = await transport.receive_some(size - len(data))
        if not chunk:
            raise HAAuthError("the peer closed the connection during the handshake")
        data += chunk
        if magic and data[:len(MAGIC)] != MAGIC[:len(data)]:
            raise HAAuthError("the peer does not speak the authentication handshake (no "
                              "haAuthSecret on its side?)")
    return bytes(data)


async def authenticate_slave(transport: HATransport, secret: str) -> None:
    """The master's side: challenge the peer, check its proof, prove ourselves."""
    key = secret.encode()
    nonce = secrets.token_bytes(NONCE_SIZE)
    await transport.send_all(hello(nonce))
    answer = await _receive_exactly(transport, SLAVE_ANSWER_SIZE, magic=True)
    slave_nonce = check_slave_answer(key, nonce, answer)
    await transport.send_all(master_proof(key, slave_nonce, nonce))


async def authenticate_master(transport: HATransport, secret: str) -> None:
    """The slave's side: answer the master's challenge, then check the master's proof."""
    key = secret.encode()
    master_nonce = read_hello(await _receive_exactly(transport, HELLO_SIZE, magic=True))
    nonce = secrets.token_bytes(NONCE_SIZE)
    await transport.send_all(slave_answer(key, master_nonce, nonce))
    proof = await _receive_exactly(transport, MASTER_PROOF_SIZE, magic=False)
    check_master_proof(key, nonce, master_nonce, proof)
