"""The typed errors of the wire layer: every decoder raises exactly one of these."""


class WireError(ValueError):
    """Base of every decode error: the input is malformed; nothing was consumed."""


class RecordDecodeError(WireError):
    """A commitlog record, batch body or message id is malformed."""
