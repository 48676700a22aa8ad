"""Authenticated replication: a handshake in front of the classic HA protocol (our extension).

RocketMQ's HA protocol has no handshake: whoever reaches a master's HA port and sends 8 bytes
gets the commitlog from that offset on, and whoever a slave connects to may feed it any bytes.
With a shared secret configured on both ends (``haAuthSecret``), each proves it knows the secret
before any offset or log byte moves, by answering the other's fresh random challenge:

====================  ==============================================================
master -> slave       MAGIC, master nonce Nm (32 bytes)
slave -> master       MAGIC, slave nonce Ns (32), the address it dialled A (18),
                      HMAC-SHA256(secret, "slave" | Nm | Ns | A)
master -> slave       HMAC-SHA256(secret, "master" | Ns | Nm | A)
====================  ==============================================================

Then the classic protocol starts (the slave's first offset report). The labels keep one side's
proof from being replayed as the other's, and each side's fresh nonce keeps a recorded answer
from being replayed at all. A classic slave, which speaks first with its 8-byte report, fails
the master's MAGIC check; a classic master, which waits for that report, never sends the hello
and the slave gives up after its handshake timeout: neither side serves a peer without the
secret. The handshake authenticates the peers; it does not encrypt the log (that is TLS's
job), so a host on the path can still read what passes.

Why the address: without it, a host the slave can be made to dial (a name server that names
it as master, a DNS entry) can relay the real slave's handshake to the real master, then keep
the master's connection and acknowledge log bytes it never stores, so a SYNC_MASTER answers
SEND_OK with no slave holding the data. The slave's proof covers the address its socket is
connected to (``A``: 16 bytes of IPv6, IPv4 as ``::ffff:a.b.c.d``, then the port), and the
master accepts it only if ``A`` is the address the connection reached it at. A relay's socket
to the master has another address than the one the slave dialled, so the relayed proof is
refused. A master behind address translation (a NAT, a forwarded port) is reached at an
address that is not its own, and cannot use the handshake: its slaves must reach it
directly. What the address does not stop is a host that rewrites packets on the path itself
(the slave dials the master's real address and the master sees it so): only encryption with
the peers' identities in it (TLS) stops that. Version 2 of the handshake (its MAGIC) is this
one; a peer of the first version, without ``A``, is refused.

Sans-I/O: the byte strings and their checks. ``trio_ha.store.ha`` runs the exchange.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import struct

import attrs

from .ha import HAProtocolError

__all__ = [
    "ENDPOINT_SIZE", "HELLO_SIZE", "MAGIC", "MASTER_PROOF_SIZE", "NONCE_SIZE",
    "NO_ENDPOINT", "SLAVE_ANSWER_SIZE", "HAAuthError", "SlaveAnswer", "check_master_proof",
    "check_slave_answer", "endpoint", "endpoint_text", "hello", "master_proof", "read_hello",
    "slave_answer",
]

#: identifies the handshake (and its version) on the wire
MAGIC = b"TRIOHA-AUTH2"
NONCE_SIZE = 32
_PROOF_SIZE = 32  # SHA-256
#: an address in the handshake: 16 bytes of IPv6 (IPv4 mapped), then a 2-byte port
ENDPOINT_SIZE = 18
#: the address of a connection that has none (a memory stream in a test)
NO_ENDPOINT = bytes(ENDPOINT_SIZE)
HELLO_SIZE = len(MAGIC) + NONCE_SIZE
SLAVE_ANSWER_SIZE = len(MAGIC) + NONCE_SIZE + ENDPOINT_SIZE + _PROOF_SIZE
MASTER_PROOF_SIZE = _PROOF_SIZE
#: the shortest secret accepted: a shorter one could be guessed offline from one exchange
MIN_SECRET_LENGTH = 16


class HAAuthError(HAProtocolError):
    """The peer did not prove it knows the secret (or does not speak the handshake)."""


def _proof(secret: bytes, label: bytes, first: bytes, second: bytes, dialled: bytes) -> bytes:
    return hmac.new(secret, label + first + second + dialled, hashlib.sha256).digest()


def endpoint(host: str, port: int) -> bytes:
    """A socket address (``getpeername()`` / ``getsockname()``'s host and port) as the
    handshake carries it. ValueError if ``host`` is not an IP address."""
    address = ipaddress.ip_address(host.partition("%")[0])  # no IPv6 scope id
    if isinstance(address, ipaddress.IPv4Address):
        address = ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + address.packed)
    return address.packed + struct.pack(">H", port)


def endpoint_text(data: bytes) -> str:
    """``host:port`` of an endpoint, for a log line."""
    if data == NO_ENDPOINT:
        return "(no address)"
    address = ipaddress.IPv6Address(data[:16])
    port = struct.unpack(">H", data[16:18])[0]
    mapped = address.ipv4_mapped
    return f"{mapped}:{port}" if mapped is not None else f"[{address}]:{port}"


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


def slave_answer(secret: bytes, master_nonce: bytes, slave_nonce: bytes,
                 dialled: bytes) -> bytes:
    """The slave's answer: MAGIC, its nonce, the address it dialled (``endpoint``), and its
    proof over the nonces and that address."""
    _check_nonce(slave_nonce)
    _check_endpoint(dialled)
    return (MAGIC + slave_nonce + dialled
            + _proof(secret, b"slave", master_nonce, slave_nonce, dialled))


@attrs.frozen
class SlaveAnswer:
    """What a proven slave answer says."""

    slave_nonce: bytes
    #: the address the slave dialled (``endpoint``)
    dialled: bytes


def check_slave_answer(secret: bytes, master_nonce: bytes, data: bytes,
                       reached_at: bytes) -> SlaveAnswer:
    """The slave's nonce and dialled address, once its answer proves the secret and names
    ``reached_at`` (the address the connection reached this master at) as the one it
    dialled; ``HAAuthError`` otherwise."""
    if len(data) != SLAVE_ANSWER_SIZE or not data.startswith(MAGIC):
        raise HAAuthError("the peer did not answer the authentication handshake (a slave "
                          "without haAuthSecret, or of an older version?)")
    start = len(MAGIC)
    slave_nonce = data[start:start + NONCE_SIZE]
    dialled = data[start + NONCE_SIZE:start + NONCE_SIZE + ENDPOINT_SIZE]
    given = data[start + NONCE_SIZE + ENDPOINT_SIZE:]
    if not hmac.compare_digest(given, _proof(secret, b"slave", master_nonce, slave_nonce,
                                             dialled)):
        raise HAAuthError("the slave's proof is wrong: it does not know haAuthSecret")
    if not hmac.compare_digest(dialled, reached_at):
        raise HAAuthError(
            f"the slave dialled {endpoint_text(dialled)}, but its connection reached this "
            f"master at {endpoint_text(reached_at)}: a relay is in between (or address "
            "translation, which the handshake does not allow)")
    return SlaveAnswer(slave_nonce, dialled)


def master_proof(secret: bytes, slave_nonce: bytes, master_nonce: bytes,
                 dialled: bytes) -> bytes:
    return _proof(secret, b"master", slave_nonce, master_nonce, dialled)


def check_master_proof(secret: bytes, slave_nonce: bytes, master_nonce: bytes,
                       dialled: bytes, data: bytes) -> None:
    if len(data) != MASTER_PROOF_SIZE or not hmac.compare_digest(
            data, master_proof(secret, slave_nonce, master_nonce, dialled)):
        raise HAAuthError("the master's proof is wrong: it does not know haAuthSecret, or it "
                          "refused the address this slave dialled")


def _check_endpoint(data: bytes) -> None:
    if len(data) != ENDPOINT_SIZE:
        raise ValueError(f"an endpoint is {ENDPOINT_SIZE} bytes, not {len(data)}")


def _check_nonce(nonce: bytes) -> None:
    if len(nonce) != NONCE_SIZE:
        raise ValueError(f"a nonce is {NONCE_SIZE} bytes, not {len(nonce)}")
