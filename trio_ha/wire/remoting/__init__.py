"""RocketMQ's remoting protocol, sans-I/O: commands, frames, the two header encodings, and the
custom headers of the requests we serve. Import from here; the modules are the parts:

- ``codes``: the numbers, as enums (request and response codes, flag bits, languages).
- ``java``: header values rendered and parsed as Java does.
- ``command``: ``RemotingCommand``, one request or response as a value.
- ``serialize``: the JSON and ROCKETMQ binary header encodings.
- ``frames``: frames in and out of a byte stream (``FrameDecoder``, ``encode``, and
  ``MappedReply`` for a body sent from the mapping).
- ``headers``: custom headers in general (``HeaderField``, ``HeaderSpec``).
- ``message_headers``: the send and pull headers.

The peer is untrusted throughout: decoding raises ``RemotingDecodeError`` (the connection must
close) or ``HeaderFieldError`` (the request gets an error response), and nothing else.
docs/remoting.md describes the protocol and the subset we speak.
"""

from ..errors import HeaderFieldError, RemotingDecodeError
from .codes import (
    DEFAULT_VERSION,
    LanguageCode,
    RemotingFlag,
    RequestCode,
    ResponseCode,
    SerializeType,
)
from .command import RemotingCommand
from .frames import (
    MAX_FRAME_LENGTH,
    MAX_HEADER_LENGTH,
    NEED_DATA,
    FrameDecoder,
    MappedReply,
    NeedData,
    decode_frame,
    encode,
    encode_head,
    encode_parts,
)
from .headers import (
    FieldKind,
    HeaderField,
    HeaderSpec,
    decode_custom_header,
    encode_custom_header,
)
from .java import JavaValue, java_string
from .message_headers import (
    PULL_MESSAGE_FIELDS,
    SEND_MESSAGE_FIELDS,
    SEND_MESSAGE_V2_FIELDS,
    PullMessageRequestHeader,
    PullSysFlag,
    SendMessageRequestHeader,
    SendRequest,
    encode_pull_message_fields,
    encode_send_message_fields,
    encode_send_message_v2_fields,
    pull_message_header,
    send_message_header,
)
from .serialize import MAX_EXT_FIELDS, MAX_EXT_KEY_LENGTH, MAX_EXT_VALUE_LENGTH

__all__ = [
    "DEFAULT_VERSION",
    "MAX_EXT_FIELDS",
    "MAX_EXT_KEY_LENGTH",
    "MAX_EXT_VALUE_LENGTH",
    "MAX_FRAME_LENGTH",
    "MAX_HEADER_LENGTH",
    "NEED_DATA",
    "PULL_MESSAGE_FIELDS",
    "SEND_MESSAGE_FIELDS",
    "SEND_MESSAGE_V2_FIELDS",
    "FieldKind",
    "FrameDecoder",
    "HeaderField",
    "HeaderFieldError",
    "HeaderSpec",
    "JavaValue",
    "LanguageCode",
    "MappedReply",
    "NeedData",
    "PullMessageRequestHeader",
    "PullSysFlag",
    "RemotingCommand",
    "RemotingDecodeError",
    "RemotingFlag",
    "RequestCode",
    "ResponseCode",
    "SendMessageRequestHeader",
    "SendRequest",
    "SerializeType",
    "decode_custom_header",
    "decode_frame",
    "encode",
    "encode_custom_header",
    "encode_head",
    "encode_parts",
    "encode_pull_message_fields",
    "encode_send_message_fields",
    "encode_send_message_v2_fields",
    "java_string",
    "pull_message_header",
    "send_message_header",
]
