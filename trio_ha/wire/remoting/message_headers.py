"""The two custom headers on the hot path: SEND_MESSAGE (and its V2, batch and reply forms)
and PULL_MESSAGE.

The send header has two spellings of the same fields: SEND_MESSAGE and SEND_REPLY_MESSAGE use
Java's long names (``producerGroup``...), SEND_MESSAGE_V2, SEND_BATCH_MESSAGE and
SEND_REPLY_MESSAGE_V2 single letters ``a``..``n`` to save bytes per message. As in the Java
broker, the request code decides which names are read, and errors quote both.
"""

from __future__ import annotations

import enum

import attrs
import orjson

from .codes import (
    DEFAULT_VERSION,
    LanguageCode,
    RemotingFlag,
    RequestCode,
    ResponseCode,
    SerializeType,
)
from .command import RemotingCommand
from .frames import encode, frame_head
from .headers import FieldKind, HeaderField, HeaderSpec

__all__ = [
    "PULL_MESSAGE_FIELDS",
    "SEND_MESSAGE_FIELDS",
    "SEND_MESSAGE_V2_FIELDS",
    "PullMessageRequestHeader",
    "PullSysFlag",
    "SendMessageRequestHeader",
    "SendRequest",
    "encode_pull_message_fields",
    "encode_send_message_fields",
    "encode_send_message_v2_fields",
    "encode_stored_send_response",
    "pull_message_header",
    "send_message_header",
]


class PullSysFlag(enum.IntFlag):
    """``sysFlag`` bits of PULL_MESSAGE."""

    COMMIT_OFFSET = 0x1
    SUSPEND = 0x2
    SUBSCRIPTION = 0x4
    CLASS_FILTER = 0x8
    LITE_PULL_MESSAGE = 0x10


@attrs.frozen
class SendMessageRequestHeader:
    """The header of SEND_MESSAGE (long names), SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE
    (single letters ``a``..``n``), and SEND_REPLY_MESSAGE(_V2)."""

    producer_group: str
    topic: str
    default_topic: str
    default_topic_queue_nums: int
    queue_id: int
    sys_flag: int
    born_timestamp: int
    flag: int
    properties: str | None = None
    reconsume_times: int | None = None
    unit_mode: bool = False
    max_reconsume_times: int | None = None
    batch: bool = False
    broker_name: str | None = None


_S, _I32, _I64, _B = FieldKind.STR, FieldKind.INT, FieldKind.LONG, FieldKind.BOOL

# (attribute, V1 name, V2 letter, kind, required)
_SEND_SPEC = (
    ("producer_group", "producerGroup", "a", _S, True),
    ("topic", "topic", "b", _S, True),
    ("default_topic", "defaultTopic", "c", _S, True),
    ("default_topic_queue_nums", "defaultTopicQueueNums", "d", _I32, True),
    ("queue_id", "queueId", "e", _I32, True),
    ("sys_flag", "sysFlag", "f", _I32, True),
    ("born_timestamp", "bornTimestamp", "g", _I64, True),
    ("flag", "flag", "h", _I32, True),
    ("properties", "properties", "i", _S, False),
    ("reconsume_times", "reconsumeTimes", "j", _I32, False),
    ("unit_mode", "unitMode", "k", _B, False),
    ("max_reconsume_times", "maxReconsumeTimes", "l", _I32, False),
    ("batch", "batch", "m", _B, False),
    ("broker_name", "bname", "n", _S, False),
)
SEND_MESSAGE_FIELDS = tuple(HeaderField(a, v1, k, r) for a, v1, _, k, r in _SEND_SPEC)
SEND_MESSAGE_V2_FIELDS = tuple(HeaderField(a, v2, k, r, v1) for a, v1, v2, k, r in _SEND_SPEC)
_V2_CODES = frozenset(
    (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE, RequestCode.SEND_REPLY_MESSAGE_V2)
)
_V1_CODES = frozenset((RequestCode.SEND_MESSAGE, RequestCode.SEND_REPLY_MESSAGE))
_SEND_V1 = HeaderSpec(SendMessageRequestHeader, SEND_MESSAGE_FIELDS)
_SEND_V2 = HeaderSpec(SendMessageRequestHeader, SEND_MESSAGE_V2_FIELDS)


def send_message_header(command: RemotingCommand) -> SendMessageRequestHeader:
    """The send header of a SEND_MESSAGE / _V2 / SEND_BATCH_MESSAGE / SEND_REPLY_MESSAGE(_V2)
    request, with the letters of the V2 forms mapped to their long names (as the Java broker
    does, the request code decides which names are read)."""
    if command.code in _V2_CODES:
        return _SEND_V2.decode(command)
    if command.code in _V1_CODES:
        return _SEND_V1.decode(command)
    raise ValueError(f"request code {command.code} is not a send request")


#: the JSON header of a SUCCESS send response, as ``encode`` writes it for ``response_to``
#: with the broker's extFields (fastjson's field order; every value is ASCII that needs no
#: escaping: a hex msgId, or several joined by commas, and numbers)
_STORED_SEND_RESPONSE = (
    f'{{"code":{int(ResponseCode.SUCCESS)},"extFields":{{"msgId":"%s","queueId":"%d",'
    f'"queueOffset":"%d","MSG_REGION":"%s","TRACE_ON":"%s"}},'
    f'"flag":{int(RemotingFlag.RESPONSE)},"language":"{LanguageCode.JAVA.name}","opaque":%d,'
    f'"serializeTypeCurrentRPC":"JSON","version":{DEFAULT_VERSION}}}'
)


def encode_stored_send_response(
    request: RemotingCommand, msg_id: str, queue_id: int, queue_offset: int, region: str,
    trace_on: str,
) -> bytes:
    """The frame of a send's SUCCESS response — ``encode(RemotingCommand.response_to(request,
    SUCCESS, ext_fields={msgId, queueId, queueOffset, MSG_REGION, TRACE_ON}))`` byte for
    byte — formatted in one step (a broker answers tens of thousands a second, and the
    general path costs several times this one). A request in the ROCKETMQ binary encoding,
    or a region or msgId that JSON would have to escape, takes the general path. Either
    raises ValueError past the frame's limits (a batch of very many ids)."""
    if (request.serialize_type == SerializeType.JSON and _plain(msg_id) and region.isalnum()
            and trace_on in ("true", "false")):
        header = (_STORED_SEND_RESPONSE % (msg_id, queue_id, queue_offset, region, trace_on,
                                           request.opaque)).encode()
        return frame_head(header, SerializeType.JSON, 0)
    return encode(RemotingCommand.response_to(
        request, ResponseCode.SUCCESS, ext_fields={
            "msgId": msg_id, "queueId": queue_id, "queueOffset": queue_offset,
            "MSG_REGION": region, "TRACE_ON": trace_on,
        }))


def _plain(text: str) -> bool:
    """Printable ASCII that JSON writes as it is (no quote, no backslash)."""
    return text.isascii() and text.isprintable() and '"' not in text and "\\" not in text


@attrs.frozen
class SendRequest:
    """A SEND_MESSAGE_V2 or SEND_BATCH_MESSAGE request whose opaque is not known yet: a
    client numbers requests as it sends them (``RemotingClient.invoke``).

    ``frame(opaque)`` is the whole frame, byte for byte what ``encode(command(), opaque=...)``
    writes, formatted in one step: a producer sends tens of thousands a second, and the
    general path (the header's extFields dict, then the command's JSON) costs nearly three
    times this one. ``command()`` is the request as a
    command, for what needs one (an ACL signature is computed over its fields)."""

    header: SendMessageRequestHeader
    body: bytes
    code: int = RequestCode.SEND_MESSAGE_V2
    language: LanguageCode = LanguageCode.JAVA
    version: int = DEFAULT_VERSION

    def command(self) -> RemotingCommand:
        return RemotingCommand(
            self.code, language=self.language, version=self.version,
            ext_fields=encode_send_message_v2_fields(self.header), body=self.body,
        )

    def frame(self, opaque: int) -> bytes:
        header = _send_v2_json(self.header, self.code, opaque, self.language, self.version)
        if header is None:  # a value the general path renders its own way
            return encode(self.command(), opaque=opaque)
        body = self.body
        return frame_head(header, SerializeType.JSON, len(body)) + body


def _send_v2_json(header: SendMessageRequestHeader, code: int, opaque: int,
                  language: LanguageCode, version: int) -> bytes | None:
    """The JSON header of a V2 send request as ``encode_json_header`` writes it (orjson:
    the extFields in the fields' order, a field that is None left out), or None when a
    value is not the plain kind this handles: an int field holding something else than an
    int (``java_string`` renders a bool in one as Java does), a str field holding something
    else than a str, a string orjson refuses (a lone surrogate, which the general path
    writes as Java does, '?').

    What stays the same from send to send — the fields before the queue id, and those after
    the properties — is formatted once per value (``_SEND_HEADS``, ``_SEND_TAILS``). The
    types are checked before each lookup: ``True == 1`` would find an int's entry."""
    queue_id, sys_flag, born, flag = (header.queue_id, header.sys_flag, header.born_timestamp,
                                      header.flag)
    reconsume, unit_mode = header.reconsume_times, header.unit_mode
    max_reconsume, batch, broker = header.max_reconsume_times, header.batch, header.broker_name
    if not (type(queue_id) is int and type(sys_flag) is int and type(born) is int
            and type(flag) is int and type(header.default_topic_queue_nums) is int
            and (reconsume is None or type(reconsume) is int)
            and (max_reconsume is None or type(max_reconsume) is int)
            and type(unit_mode) is bool and type(batch) is bool):
        return None
    head_key = (code, header.producer_group, header.topic, header.default_topic,
                header.default_topic_queue_nums)
    head = _SEND_HEADS.get(head_key)
    if head is None:
        head = _cached(_SEND_HEADS, head_key, _send_head(*head_key))
    tail_key = (reconsume, unit_mode, max_reconsume, batch, broker, language, version)
    tail = _SEND_TAILS.get(tail_key)
    if tail is None:
        tail = _cached(_SEND_TAILS, tail_key, _send_tail(*tail_key))
    if not head or not tail:
        return None
    properties = header.properties
    if properties is None:
        middle = ""
    elif type(properties) is not str:
        return None
    else:
        try:
            middle = ',"i":' + orjson.dumps(properties).decode()
        except orjson.JSONEncodeError:
            return None
    return (f'{head}"e":"{queue_id}","f":"{sys_flag}","g":"{born}","h":"{flag}"{middle}{tail}'
            f'{opaque},"serializeTypeCurrentRPC":"JSON","version":{version}}}').encode()


#: formatted parts of send headers, by the values they hold ("" for values the general
#: path must render); a producer sends to a few topics, the bound only guards against many
_SEND_HEADS: dict[tuple[object, ...], str] = {}
_SEND_TAILS: dict[tuple[object, ...], str] = {}
_SEND_PARTS_BOUND = 1024


def _cached(cache: dict[tuple[object, ...], str], key: tuple[object, ...], value: str) -> str:
    if len(cache) >= _SEND_PARTS_BOUND:
        cache.clear()
    cache[key] = value
    return value


def _send_head(code: int, group: object, topic: object, default_topic: object,
               queue_nums: int) -> str:
    if not (type(group) is str and type(topic) is str and type(default_topic) is str):
        return ""
    try:
        return (f'{{"code":{int(code)},"extFields":{{"a":{orjson.dumps(group).decode()},'
                f'"b":{orjson.dumps(topic).decode()},"c":{orjson.dumps(default_topic).decode()},'
                f'"d":"{queue_nums}",')
    except orjson.JSONEncodeError:
        return ""


def _send_tail(reconsume: int | None, unit_mode: bool, max_reconsume: int | None, batch: bool,
               broker: object, language: LanguageCode, version: int) -> str:
    parts = [f',"j":"{reconsume}"' if reconsume is not None else "",
             ',"k":"true"' if unit_mode else ',"k":"false"',
             f',"l":"{max_reconsume}"' if max_reconsume is not None else "",
             ',"m":"true"' if batch else ',"m":"false"']
    if broker is not None:
        if type(broker) is not str:
            return ""
        try:
            parts.append(f',"n":{orjson.dumps(broker).decode()}')
        except orjson.JSONEncodeError:
            return ""
    parts.append(f'}},"flag":0,"language":"{language.name}","opaque":')
    return "".join(parts)


def encode_send_message_v2_fields(header: SendMessageRequestHeader) -> dict[str, str]:
    """extFields of a SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE request."""
    return _SEND_V2.encode(header)


def encode_send_message_fields(header: SendMessageRequestHeader) -> dict[str, str]:
    """extFields of a SEND_MESSAGE (V1, long names) request."""
    return _SEND_V1.encode(header)


@attrs.frozen
class PullMessageRequestHeader:
    """The header of PULL_MESSAGE (11)."""

    consumer_group: str
    topic: str
    queue_id: int
    queue_offset: int
    max_msg_nums: int
    sys_flag: int
    commit_offset: int
    suspend_timeout_millis: int
    sub_version: int
    subscription: str | None = None
    expression_type: str | None = None
    #: 5.x additions, absent from 4.x clients
    max_msg_bytes: int | None = None
    broker_name: str | None = None

    @property
    def has_commit_offset(self) -> bool:
        return bool(self.sys_flag & PullSysFlag.COMMIT_OFFSET)

    @property
    def has_suspend(self) -> bool:
        return bool(self.sys_flag & PullSysFlag.SUSPEND)

    @property
    def has_subscription(self) -> bool:
        return bool(self.sys_flag & PullSysFlag.SUBSCRIPTION)

PULL_MESSAGE_FIELDS = (
    HeaderField("consumer_group", "consumerGroup"),
    HeaderField("topic", "topic"),
    HeaderField("queue_id", "queueId", _I32),
    HeaderField("queue_offset", "queueOffset", _I64),
    HeaderField("max_msg_nums", "maxMsgNums", _I32),
    HeaderField("sys_flag", "sysFlag", _I32),
    HeaderField("commit_offset", "commitOffset", _I64),
    HeaderField("suspend_timeout_millis", "suspendTimeoutMillis", _I64),
    HeaderField("subscription", "subscription", _S, False),
    HeaderField("sub_version", "subVersion", _I64),
    HeaderField("expression_type", "expressionType", _S, False),
    HeaderField("max_msg_bytes", "maxMsgBytes", _I32, False),
    HeaderField("broker_name", "bname", _S, False),
)


_PULL = HeaderSpec(PullMessageRequestHeader, PULL_MESSAGE_FIELDS)


def pull_message_header(command: RemotingCommand) -> PullMessageRequestHeader:
    """The header of a PULL_MESSAGE request."""
    return _PULL.decode(command)


def encode_pull_message_fields(header: PullMessageRequestHeader) -> dict[str, str]:
    """extFields of a PULL_MESSAGE request."""
    return _PULL.encode(header)
