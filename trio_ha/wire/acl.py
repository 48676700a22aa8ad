"""What RocketMQ's ACL signs: the bytes of a request a client's secret key vouches for.

RocketMQ 4.9's plain ACL has no handshake: every request carries its account's ``AccessKey``
(and optionally a ``SecurityToken``) among its extFields, plus a ``Signature``: Base64 of
HMAC-SHA1, keyed with the account's secret key, over the *values* of every other extField in
the byte order of their keys (Java's ``TreeMap<String, String>``), concatenated as UTF-8,
followed by the body. The Java client's ``AclClientRPCHook`` adds the fields and signs; the
broker's ``PlainAccessValidator`` recomputes the signature over what arrived, leaving out
``Signature``. (RocketMQ 4.9's broker also leaves out ``_UNIQUE_KEY_QUERY``, which its own
client signs when it queries by unique key: such queries never verify there. Ours keeps it in
the content, so they do.)

That content names neither the request code nor the fields' keys nor a time, so a captured
request verifies again, and verifies as another request whose values concatenate to the same
bytes (a read of ``{topic}`` as DELETE_TOPIC_IN_BROKER of ``{topic}``). Our client therefore
adds one more extField when it signs, the *seal* (``AclSeal``): the request code, the time,
a random nonce, and an HMAC (same secret) over those and every other field's key and value,
length-prefixed so no two requests encode alike. The seal is an ordinary extField, so the
RocketMQ signature covers it and a real RocketMQ broker, which signs every extField it
receives, verifies our requests unchanged; ours checks the seal when it is there (and, in its
strict mode, wants it, fresh and unseen: ``trio_ha.acl.replay``).

Sans-I/O like the rest of ``wire``: the validator that decides what an account may do is
``trio_ha.acl``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time

import attrs

from .remoting import RemotingCommand

__all__ = [
    "ACCESS_KEY", "SEAL", "SECURITY_TOKEN", "SIGNATURE", "UNSIGNED_FIELDS", "Credentials",
    "Seal", "equal_text", "request_content", "request_signature", "seal_mac", "sign", "signature",
]

ACCESS_KEY = "AccessKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"
#: extFields left out of the signed content
UNSIGNED_FIELDS = frozenset({SIGNATURE})
#: our extField binding a signed request to its code, a time and a nonce (see the docstring)
SEAL = "AclSeal"
#: the seal's format: ``1:<code>:<unix ms>:<nonce>:<base64 HMAC-SHA256>`` (``seal_mac``).
#: Its ':' cannot be part of a topic or group name, so a seal's bytes cannot pass for one
_SEAL_VERSION = "1"
#: what the seal's MAC covers begins with this (a seal's MAC can never pass for a signature)
_SEAL_DOMAIN = b"trio-ha acl seal 1\n"
#: the longest seal read (a hostile one costs a length check, nothing more)
MAX_SEAL_CHARS = 160


@attrs.frozen(repr=False)
class Credentials:
    """An ACL account as a client holds it (Java's ``SessionCredentials``)."""

    access_key: str
    secret_key: str
    security_token: str | None = None

    def __repr__(self) -> str:  # never the secret in a log line or a traceback
        return f"Credentials(access_key={self.access_key!r}, secret_key=<hidden>)"


def _java_utf8(text: str) -> bytes:
    # Java's getBytes(UTF_8) writes '?' for a lone surrogate
    return text.encode("utf-8", "replace")


def _signed_fields(ext_fields: dict[str, str]) -> bytes:
    """The values of ``ext_fields`` but Signature, ordered by key as Java's
    ``String.compareTo`` orders them (UTF-16 code units), as UTF-8."""
    keys = sorted((key for key in ext_fields if key not in UNSIGNED_FIELDS),
                  key=lambda key: key.encode("utf-16-be", "surrogatepass"))
    return _java_utf8("".join(ext_fields[key] for key in keys))


def request_content(ext_fields: dict[str, str], body: bytes | None) -> bytes:
    """The signed bytes: the fields' values (``_signed_fields``), then the body."""
    return _signed_fields(ext_fields) + (body or b"")


def signature(content: bytes, secret_key: str) -> str:
    """Base64 of HMAC-SHA1 over ``content``, keyed with ``secret_key`` (``AclSigner``)."""
    return _base64(hmac.new(_java_utf8(secret_key), content, hashlib.sha1))


def request_signature(ext_fields: dict[str, str], body: bytes | None, secret_key: str) -> str:
    """``signature(request_content(...))``, without copying the body into one buffer: every
    signed request pays it, and a body may be megabytes."""
    mac = hmac.new(_java_utf8(secret_key), _signed_fields(ext_fields), hashlib.sha1)
    if body:
        mac.update(body)
    return _base64(mac)


def equal_text(given: str, expected: str) -> bool:
    """Constant-time comparison (the time a mismatch takes tells nothing of the secret)."""
    return hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode())


def _base64(mac: hmac.HMAC) -> str:
    return base64.b64encode(mac.digest()).decode("ascii")


@attrs.frozen
class Seal:
    """A request's ``AclSeal`` field, read (its MAC not yet checked: ``seal_mac``)."""

    code: int
    time_ms: int
    nonce: str
    mac: str

    @classmethod
    def parse(cls, text: str) -> Seal | None:
        """The seal in ``text``, or None when it is not one."""
        if len(text) > MAX_SEAL_CHARS:
            return None
        parts = text.split(":")
        if len(parts) != 5 or parts[0] != _SEAL_VERSION:
            return None
        _, code, time_ms, nonce, mac = parts
        if not (_decimal(code) and _decimal(time_ms) and nonce and mac):
            return None
        return cls(int(code), int(time_ms), nonce, mac)

    def text(self) -> str:
        return f"{_SEAL_VERSION}:{self.code}:{self.time_ms}:{self.nonce}:{self.mac}"


def _decimal(text: str) -> bool:
    return 0 < len(text) <= 19 and text.isascii() and text.isdigit()


def seal_mac(secret_key: str, code: int, time_ms: int, nonce: str,
             ext_fields: dict[str, str]) -> str:
    """The seal's MAC: HMAC-SHA256 over its code, time and nonce and every extField's key
    and value but Signature's and the seal's, in key order, each prefixed by its length in
    characters, so that no two different requests share it (the body is covered by the
    RocketMQ signature, which covers the seal)."""
    content = "".join([f"{code}:{time_ms}:{len(nonce)}:{nonce}\n", *[
        f"{len(key)}:{key}{len(value)}:{value}" for key, value in sorted(ext_fields.items())
        if key not in UNSIGNED_FIELDS and key != SEAL]])
    digest = hmac.digest(_java_utf8(secret_key), _SEAL_DOMAIN + _java_utf8(content), "sha256")
    return base64.b64encode(digest).decode("ascii")


def sign(command: RemotingCommand, credentials: Credentials) -> RemotingCommand:
    """``command`` with the account's fields and its signature added, as the Java client's
    ``AclClientRPCHook`` sends it (every extField a value, the hook's own ones included),
    plus our seal (see the module's docstring)."""
    fields = dict(command.ext_fields)
    fields[ACCESS_KEY] = credentials.access_key
    if credentials.security_token is not None:
        fields[SECURITY_TOKEN] = credentials.security_token
    fields.pop(SIGNATURE, None)
    fields.pop(SEAL, None)
    time_ms = time.time_ns() // 1_000_000
    nonce = secrets.token_urlsafe(12)  # 96 random bits: never the same twice in a window
    fields[SEAL] = Seal(command.code, time_ms, nonce, seal_mac(
        credentials.secret_key, command.code, time_ms, nonce, fields)).text()
    fields[SIGNATURE] = request_signature(fields, command.body, credentials.secret_key)
    return attrs.evolve(command, ext_fields=fields)
