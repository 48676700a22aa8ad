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

Sans-I/O like the rest of ``wire``: the validator that decides what an account may do is
``trio_ha.acl``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

import attrs

from .remoting import RemotingCommand

__all__ = [
    "ACCESS_KEY", "SECURITY_TOKEN", "SIGNATURE", "UNSIGNED_FIELDS", "Credentials",
    "request_content", "request_signature", "sign", "signature",
]

ACCESS_KEY = "AccessKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"
#: extFields left out of the signed content
UNSIGNED_FIELDS = frozenset({SIGNATURE})


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


def _base64(mac: hmac.HMAC) -> str:
    return base64.b64encode(mac.digest()).decode("ascii")


def sign(command: RemotingCommand, credentials: Credentials) -> RemotingCommand:
    """``command`` with the account's fields and its signature added, as the Java client's
    ``AclClientRPCHook`` sends it (every extField a value, the hook's own ones included)."""
    fields = dict(command.ext_fields)
    fields[ACCESS_KEY] = credentials.access_key
    if credentials.security_token is not None:
        fields[SECURITY_TOKEN] = credentials.security_token
    fields.pop(SIGNATURE, None)
    fields[SIGNATURE] = request_signature(fields, command.body, credentials.secret_key)
    return attrs.evolve(command, ext_fields=fields)
