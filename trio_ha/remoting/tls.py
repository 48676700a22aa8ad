"""TLS on remoting, as RocketMQ configures it: ``tls.*`` settings, three server modes.

RocketMQ's server looks at the first byte a connection sends: 0x16 opens a TLS handshake, and
anything else is a plain frame (its length's high byte). ``tls.server.mode`` decides what each
is allowed to be:

* ``disabled``: plain only; a TLS handshake is refused (the connection closed);
* ``permissive``: either, per connection (RocketMQ's default, for migrating a cluster);
* ``enforcing``: TLS only; a plain connection is closed before a byte of it is read.

A client uses TLS for every connection when ``tls.enable`` is true. RocketMQ's
``tls.test.mode.enable`` (true by default!) makes a client trust any certificate; here a
client verifies the server's certificate against ``tls.client.trustCertPath`` unless that test
mode is asked for explicitly, without checking the address it names (RocketMQ does not either:
brokers are addressed by IP); trusting the system's store instead, it checks the address too.

The settings come as RocketMQ's keys (``tls.server.mode``, ``tls.server.certPath``, ...): in a
``tls.config.file`` properties file, or directly in broker.conf / namesrv.conf (ours). One
difference: without a certificate there is nothing to serve TLS with, so the default mode is
``disabled`` here; RocketMQ's ``permissive`` default makes up a self-signed certificate.

The sockets stay trio's: a TLS connection is a ``trio.SSLStream`` over the accepted
``SocketStream``. The remoting connection then writes through the stream, not with its own
``writev`` (which would bypass the encryption): TLS costs those fast paths.
"""

from __future__ import annotations

import enum
import logging
import os
import socket
import ssl
from collections.abc import Mapping

import attrs
import trio

from .._errors import TrioHAError
from ..config import ConfigError, parse_properties_text

__all__ = [
    "TLS_KEYS", "ClientAuth", "TlsClientConfig", "TlsMode", "TlsRefused", "TlsServerConfig",
    "tls_settings",
]

log = logging.getLogger(__name__)

#: the first byte of a TLS handshake record
_HANDSHAKE = 0x16

#: RocketMQ's TLS keys (TlsSystemConfig)
TLS_KEYS = frozenset({
    "tls.server.mode", "tls.enable", "tls.config.file", "tls.test.mode.enable",
    "tls.server.need.client.auth", "tls.server.keyPath", "tls.server.keyPassword",
    "tls.server.certPath", "tls.server.authClient", "tls.server.trustCertPath",
    "tls.client.keyPath", "tls.client.keyPassword", "tls.client.certPath",
    "tls.client.authServer", "tls.client.trustCertPath",
})


class TlsMode(enum.StrEnum):
    DISABLED = "disabled"
    PERMISSIVE = "permissive"
    ENFORCING = "enforcing"


class ClientAuth(enum.StrEnum):
    NONE = "none"
    OPTIONAL = "optional"
    REQUIRE = "require"


class TlsRefused(TrioHAError):
    """A connection the server's TLS mode does not take, or whose handshake failed."""


def tls_settings(properties: Mapping[str, str]) -> dict[str, str]:
    """The ``tls.*`` settings among ``properties``, with those of the ``tls.config.file`` it
    names under them (the file's values fill in what the properties do not set)."""
    settings = {k.strip(): str(v).strip() for k, v in properties.items()
                if k.strip() in TLS_KEYS}
    path = settings.get("tls.config.file")
    if path:
        try:
            with open(path, encoding="utf-8") as file:
                from_file = parse_properties_text(file.read())
        except OSError as exc:
            raise ConfigError(f"tls.config.file {path}: {exc.strerror or exc}") from None
        for key, value in from_file.items():
            if key in TLS_KEYS:
                settings.setdefault(key, value)
    return settings


def _choice(enum_type: type[enum.StrEnum], key: str, raw: str | None, default: str) -> str:
    value = (raw or default).strip().lower()
    if value not in {member.value for member in enum_type}:
        raise ConfigError(f"{key}={raw!r}: expected one of "
                          f"{', '.join(member.value for member in enum_type)}")
    return value


def _true(raw: str | None, default: bool) -> bool:
    return default if raw is None else raw.strip().lower() == "true"


def _file(key: str, value: str | None) -> str | None:
    if value is not None and not os.path.isfile(value):
        raise ConfigError(f"{key}={value}: no such file")
    return value


@attrs.frozen
class TlsServerConfig:
    """A server's TLS: its mode, certificate and key, and whether clients need one."""

    mode: TlsMode = TlsMode.DISABLED
    cert_path: str | None = None
    key_path: str | None = None
    key_password: str | None = attrs.field(default=None, repr=False)
    trust_cert_path: str | None = None
    client_auth: ClientAuth = ClientAuth.NONE

    @classmethod
    def from_settings(cls, settings: Mapping[str, str]) -> TlsServerConfig:
        mode = TlsMode(_choice(TlsMode, "tls.server.mode", settings.get("tls.server.mode"),
                               "disabled"))
        auth = ClientAuth(_choice(ClientAuth, "tls.server.need.client.auth",
                                  settings.get("tls.server.need.client.auth"), "none"))
        config = cls(
            mode=mode,
            cert_path=_file("tls.server.certPath", settings.get("tls.server.certPath")),
            key_path=_file("tls.server.keyPath", settings.get("tls.server.keyPath")),
            key_password=settings.get("tls.server.keyPassword"),
            trust_cert_path=_file("tls.server.trustCertPath",
                                  settings.get("tls.server.trustCertPath")),
            client_auth=auth,
        )
        if mode is not TlsMode.DISABLED and not (config.cert_path and config.key_path):
            raise ConfigError(f"tls.server.mode={mode}: tls.server.certPath and "
                              "tls.server.keyPath are needed (the certificate to serve)")
        if auth is not ClientAuth.NONE and not config.trust_cert_path:
            raise ConfigError(f"tls.server.need.client.auth={auth}: tls.server.trustCertPath "
                              "is needed (the CA that signs client certificates)")
        return config

    @property
    def enabled(self) -> bool:
        return self.mode is not TlsMode.DISABLED

    def context(self) -> ssl.SSLContext:
        """The server's SSLContext (raises ConfigError for unreadable files)."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            assert self.cert_path is not None
            context.load_cert_chain(self.cert_path, self.key_path, self.key_password)
            if self.trust_cert_path:
                context.load_verify_locations(self.trust_cert_path)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"TLS: cannot load the server's certificate or key: {exc}") \
                from None
        context.verify_mode = {ClientAuth.NONE: ssl.CERT_NONE,
                               ClientAuth.OPTIONAL: ssl.CERT_OPTIONAL,
                               ClientAuth.REQUIRE: ssl.CERT_REQUIRED}[self.client_auth]
        return context

    async def secure(self, stream: trio.SocketStream, context: ssl.SSLContext,
                     timeout: float) -> trio.abc.Stream:
        """The stream to serve an accepted connection on (permissive or enforcing mode: a
        server without TLS has no TLS layer, and a handshake there fails as a bad frame): as
        it is (plain), or TLS over it once the handshake is done. Raises ``TlsRefused`` for a
        connection the mode does not take, a handshake that fails, or a peer silent for
        ``timeout`` seconds."""
        first: bytes | None = None
        with trio.move_on_after(timeout):
            try:
                first = await stream.socket.recv(1, socket.MSG_PEEK)
            except OSError as exc:  # reset before its first byte: its loss, not the server's
                raise TlsRefused(f"the connection failed before its first byte: {exc}") \
                    from None
        if first is None:
            raise TlsRefused(f"nothing sent within {timeout:g} s")
        if not first:
            raise TlsRefused("closed before sending anything")
        if first[0] != _HANDSHAKE:
            if self.mode is TlsMode.ENFORCING:
                raise TlsRefused("a plain connection, and tls.server.mode is enforcing")
            return stream
        secured = trio.SSLStream(stream, context, server_side=True)
        with trio.move_on_after(timeout) as waited:
            try:
                await secured.do_handshake()
            except (trio.BrokenResourceError, OSError) as exc:
                raise TlsRefused(f"TLS handshake failed: {exc.__cause__ or exc}") from None
        if waited.cancelled_caught:
            raise TlsRefused(f"the TLS handshake did not finish within {timeout:g} s")
        return secured


@attrs.frozen
class TlsClientConfig:
    """A client's TLS (``tls.enable``): what it trusts, and its own certificate if a server
    asks for one."""

    enable: bool = False
    #: trust any server certificate (RocketMQ's tls.test.mode.enable): tests only
    test_mode: bool = False
    trust_cert_path: str | None = None
    cert_path: str | None = None
    key_path: str | None = None
    key_password: str | None = attrs.field(default=None, repr=False)

    @classmethod
    def from_settings(cls, settings: Mapping[str, str]) -> TlsClientConfig:
        return cls(
            enable=_true(settings.get("tls.enable"), False),
            test_mode=_true(settings.get("tls.test.mode.enable"), False),
            trust_cert_path=_file("tls.client.trustCertPath",
                                  settings.get("tls.client.trustCertPath")),
            cert_path=_file("tls.client.certPath", settings.get("tls.client.certPath")),
            key_path=_file("tls.client.keyPath", settings.get("tls.client.keyPath")),
            key_password=settings.get("tls.client.keyPassword"),
        )

    def context(self) -> ssl.SSLContext:
        """The client's SSLContext; ConfigError for files it cannot load. With a CA of its
        own (``trust_cert_path``), any certificate that CA signed is the server's, whatever
        address it names (RocketMQ addresses brokers by IP and checks no names); trusting the
        system's store instead, the certificate must also name the address dialled, or any
        publicly trusted certificate would do."""
        try:
            context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH,
                                                 cafile=self.trust_cert_path)
            if self.cert_path:
                context.load_cert_chain(self.cert_path, self.key_path, self.key_password)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"TLS: cannot load the client's CA, certificate or key: {exc}") \
                from None
        context.check_hostname = self.trust_cert_path is None and not self.test_mode
        if self.test_mode:
            context.verify_mode = ssl.CERT_NONE
        return context

    async def wrap(self, stream: trio.SocketStream, context: ssl.SSLContext,
                   server_hostname: str) -> trio.SSLStream[trio.SocketStream]:
        secured = trio.SSLStream(stream, context, server_hostname=server_hostname)
        await secured.do_handshake()
        return secured
