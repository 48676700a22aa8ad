"""Authenticated replication: a handshake in front of the classic HA protocol (our extension).

RocketMQ's HA protocol has no handshake: whoever reaches a master's HA port and sends 8 bytes
gets the commitlog from that offset on, and whoever a slave connects to may feed it any bytes.
With a shared secret configured on both ends (``haAuthSecret``), each proves it knows the secret
before any offset or log byte moves, by answering the other's fresh random challenge:

====================  ==============================================================
master -> slave       MAGIC, master nonce (32 bytes)
slave -> master       MAGIC, slave nonce (32), HMAC-SHA256(secret, "slave" | Nm | Ns)
master -> slave       HMAC-SHA256(secret, "master" | Ns | Nm)
====================  ==============================================================

Then the classic protocol starts (the slave's first offset report). The labels keep one side's
proof from being replayed as the other's, and each side's fresh nonce keeps a recorded answer
from being replayed at all. A classic slave, which speaks first with its 8-byte report, fails
the master's MAGIC check; a classic master, which waits for that report, never sends the hello
and the slave gives up after its handshake timeout: neither side serves a peer without the
secret. The handshake authenticates the peers; it does not encrypt the log (that is TLS's
job), so a host on the path can still read what passes.

Sans-I/O: the byte strings and their checks. ``trio_ha.store.ha`` runs the exchange.
"""

from __future__ import annotations

import hashlib
import hmac

from .ha import HAProtocolError

__all__ = [
    "HELLO_SIZE", "MAGIC", "MASTER_PROOF_SIZE", "NONCE_SIZE", "SLAVE_ANSWER_SIZE",
    "HAAuthError", "check_master_proof", "check_slave_answer", "hello", "master_proof",
    "read_hello", "slave_answer",
]

#: identifies the handshake (and its version) on the wire
MAGIC = b"TRIOHA-AUTH1"
NONCE_SIZE = 32
_PROOF_SIZE = 32  # SHA-256
HELLO_SIZE = len(MAGIC) + NONCE_SIZE
SLAVE_ANSWER_SIZE = len(MAGIC) + NONCE_SIZE + _PROOF_SIZE
MASTER_PROOF_SIZE = _PROOF_SIZE
#: the shortest secret accepted: a shorter one could be guessed offline from one exchange
MIN_SECRET_LENGTH = 16


class HAAuthError(HAProtocolError):
    """The peer did not prove it knows the secret (or does not speak the handshake)."""


def _proof(secret: bytes, label: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(secret, label + first + second, hashlib.sha256).digest()


def hello(master_nonce: bytes) -> bytes:
    """The master's opening: MAGIC and its nonce."""
    _check_nonce(master_nonce)
    return MAGIC + master_nonce


def read_hello(data: bytes) -> bytes:
    """The master's nonce from its hello; ``HAAuthError`` if it is not one."""
    if len(data) != HELLO_SIZE or not data.startswith(MAGIC):
        raise HAAuthError("the master did not open with the authentication handshake (is "
                          "haAuthSecret set on the master?)")
    return data[len(MAGIC):]


def slave_answer(secret: bytes, master_nonce: bytes, slave_nonce: bytes) -> bytes:
    """The slave's answer: MAGIC, its nonce, and its proof over both nonces."""
    _check_nonce(slave_nonce)
    return MAGIC + slave_nonce + _proof(secret, b"slave", master_nonce, slave_nonce)


def check_slave_answer(secret: bytes, master_nonce: bytes, data: bytes) -> bytes:
    """The slave's nonce, once its answer proves the secret; ``HAAuthError`` otherwise."""
    if len(data) != SLAVE_ANSWER_SIZE or not data.startswith(MAGIC):
        raise HAAuthError("the peer did not answer the authentication handshake (a slave "
                          "without haAuthSecret?)")
    slave_nonce = data[len(MAGIC):len(MAGIC) + NONCE_SIZE]
    given = data[len(MAGIC) + NONCE_SIZE:]
    if not hmac.compare_digest(given, _proof(secret, b"slave", master_nonce, slave_nonce)):
        raise HAAuthError("the slave's proof is wrong: it does not know haAuthSecret")
    return slave_nonce


def master_proof(secret: bytes, slave_nonce: bytes, master_nonce: bytes) -> bytes:
    return _proof(secret, b"master", slave_nonce, master_nonce)


def check_master_proof(secret: bytes, slave_nonce: bytes, master_nonce: bytes,
                       data: bytes) -> None:
    if len(data) != MASTER_PROOF_SIZE or not hmac.compare_digest(
            data, master_proof(secret, slave_nonce, master_nonce)):
        raise HAAuthError("the master's proof is wrong: it does not know haAuthSecret")


def _check_nonce(nonce: bytes) -> None:
    if len(nonce) != NONCE_SIZE:
        raise ValueError(f"a nonce is {NONCE_SIZE} bytes, not {len(nonce)}")
