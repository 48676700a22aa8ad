"""Sans-I/O codecs: bytes in, frozen values out, and back. No trio, no files, no sockets."""

from .errors import RecordDecodeError, WireError

__all__ = ["RecordDecodeError", "WireError"]
