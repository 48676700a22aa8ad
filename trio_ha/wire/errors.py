"""The typed errors of the wire layer: every decoder raises exactly one of these."""

from .._errors import TrioHAError


class WireError(TrioHAError, ValueError):
    """Base of every decode error: the input is malformed; nothing was consumed."""


class RecordDecodeError(WireError):
    """A commitlog record, batch body or message id is malformed."""


class RemotingDecodeError(WireError):
    """A remoting frame or header is malformed; the connection must be closed."""


class HeaderFieldError(RemotingDecodeError):
    """A custom header field (extFields) is missing or malformed. The frame itself was fine:
    the server answers with an error response instead of closing the connection."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class RouteDecodeError(WireError):
    """A name server / broker JSON body (route data, register body, heartbeat) is malformed."""


class MetadataDecodeError(WireError):
    """A config JSON file (topics.json, consumerOffset.json, ...) is malformed."""
