"""What the seeded fuzzer sends a node's ports: valid frames, and the ways to break them.

Why mutate valid frames rather than send random bytes: random bytes die in the first four
(a frame length out of range) and never reach a header decoder, let alone a request handler.
A valid request with one thing wrong — a length field, a bit of its JSON header, an extFields
value, its body — gets past everything before the thing that is wrong, so every layer is
exercised: framing, both header encodings, the custom headers, the body decoders (heartbeat,
batch, register, lock bodies), the handlers and the store behind them. Pure random bytes and
whole frames repeated, cut or spliced are in the mix too.

What is fuzzed, by port:

* a broker's remoting port: sends (single, V2, batch), pulls, heartbeats, offsets, route and
  admin queries and the admin codes that create or change things (topics, groups, offsets,
  locks, transactions, deletion of the fuzzer's own topic);
* a name server: route and cluster queries, broker registration (JSON and compressed),
  unregistration, the KV config, topic lists, data versions;
* a master's HA port: slave report streams (a request, then acks);
* a slave's HA client: master frame streams (``mutate_master_frames``), which ``fuzz``
  serves from a ``RogueHAMaster`` the slave is pointed at.

Every name the templates carry is the fuzzer's own (``Fuzz*`` topics, groups, broker and
cluster, the ``fuzz`` KV namespace). A mutated request code may turn any template into any
request, so no template names anything a real client uses: whatever the fuzzer makes the
node do, it does to the fuzzer's things, and the node's real clients keep working. Two
things are left out on purpose: master frames that would start an empty slave's log (a
master is trusted with its slave's bytes: the protocol has no checksum, so such a stream
would write bytes the store must then report as damage), and templates of the admin
requests that change a real broker or its route (``UPDATE_BROKER_CONFIG``,
``WIPE_WRITE_PERM_OF_BROKER``: RocketMQ's protocol has no authentication, so a well-formed
admin request is administration, not an attack).

Why apart from the sending: everything here is a pure function of a ``random.Random``
(``Fuzzer`` draws the next frame for a target, seeded per target from one seed), with no
socket and no trio, so a seed's frames can be drawn and checked on their own; ``fuzz``
sends them, over real sockets, and counts what the node answered.
"""

from __future__ import annotations

import enum
import json
import random
import struct
import zlib
from collections.abc import Callable, Sequence

import attrs

from ..wire import record as rec
from ..wire.errors import WireError
from ..wire.ha import FRAME_HEADER, NEED_DATA, REPORT, FrameHeader, SlaveProtocol
from ..wire.layout import INT64_MAX
from ..wire.metadata import DataVersion, TopicConfig, TopicConfigSerializeWrapper
from ..wire.remoting import RemotingCommand, RequestCode, SerializeType, encode
from ..wire.route import RegisterBrokerBody

__all__ = [
    "EDGE_VALUES", "FUZZ_BROKER", "FUZZ_CLUSTER", "FUZZ_GROUP", "FUZZ_PRODUCERS", "FUZZ_TOPIC",
    "HOSTILE_TEXT", "REMOTING_MUTATIONS", "WHOLE_FRAME_MUTATIONS", "Fuzzer", "FuzzTarget",
    "RemotingMutation", "TargetKind", "broker_templates", "flip_bits", "master_frames",
    "mutate_master_frames", "mutate_reports", "namesrv_templates", "report_stream",
    "would_start_a_log",
]

FUZZ_TOPIC = "FuzzTopic"
FUZZ_GROUP = "fuzz_cg"
FUZZ_PRODUCERS = "fuzz_pg"
FUZZ_BROKER = "FuzzBroker"
FUZZ_CLUSTER = "FuzzCluster"


class TargetKind(enum.Enum):
    BROKER = "broker"
    NAMESRV = "namesrv"
    HA_MASTER = "HA master"


@attrs.frozen
class FuzzTarget:
    name: str
    kind: TargetKind
    address: str



# ---- templates: valid frames -----------------------------------------------------------------


def _both_encodings(commands: Sequence[RemotingCommand]) -> list[RemotingCommand]:
    return [attrs.evolve(command, opaque=i + 1, serialize_type=stype)
            for i, command in enumerate(commands) for stype in SerializeType]


def broker_templates() -> list[RemotingCommand]:
    """Valid requests to a broker, naming only the fuzzer's topic and groups."""
    send_fields = {"producerGroup": FUZZ_PRODUCERS, "topic": FUZZ_TOPIC,
                   "defaultTopic": "TBW102", "defaultTopicQueueNums": 4, "queueId": 0,
                   "sysFlag": 0, "bornTimestamp": 1_700_000_000_000, "flag": 0,
                   "properties": "KEYS\x01fuzz\x02TAGS\x01a", "reconsumeTimes": 0}
    v2_fields = dict(zip("abcdefghij", send_fields.values(), strict=True))
    batch = rec.encode_batch([rec.Message(FUZZ_TOPIC, b"fuzz one", tags="a"),
                              rec.Message(FUZZ_TOPIC, b"fuzz two", keys="k")])
    pull = {"consumerGroup": FUZZ_GROUP, "topic": FUZZ_TOPIC, "queueId": 0, "queueOffset": 0,
            "maxMsgNums": 32, "sysFlag": 6, "commitOffset": 0, "suspendTimeoutMillis": 500,
            "subscription": "*", "subVersion": 0, "expressionType": "TAG"}
    heartbeat = json.dumps({
        "clientID": "fuzz@1", "producerDataSet": [{"groupName": FUZZ_PRODUCERS}],
        "consumerDataSet": [{
            "groupName": FUZZ_GROUP, "consumeType": "CONSUME_PASSIVELY",
            "messageModel": "CLUSTERING", "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
            "unitMode": False, "subscriptionDataSet": [{
                "topic": FUZZ_TOPIC, "subString": "a || b", "tagsSet": ["a", "b"],
                "codeSet": [97, 98], "subVersion": 1, "expressionType": "TAG",
                "classFilterMode": False}]}],
    }).encode()
    queue = {"topic": FUZZ_TOPIC, "brokerName": "broker-a", "queueId": 0}
    locks = json.dumps({"consumerGroup": FUZZ_GROUP, "clientId": "fuzz@1",
                        "mqSet": [queue]}).encode()
    queue_fields = {"topic": FUZZ_TOPIC, "queueId": 0}
    request = RemotingCommand.request
    return _both_encodings([
        request(RequestCode.SEND_MESSAGE, send_fields, b"fuzz body"),
        request(RequestCode.SEND_MESSAGE_V2, v2_fields, b"fuzz body v2"),
        request(RequestCode.SEND_BATCH_MESSAGE, {**v2_fields, "m": True}, batch),
        request(RequestCode.PULL_MESSAGE, pull),
        request(RequestCode.HEART_BEAT, body=heartbeat),
        request(RequestCode.UNREGISTER_CLIENT, {"clientID": "fuzz@1",
                                                "consumerGroup": FUZZ_GROUP}),
        request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": FUZZ_GROUP}),
        request(RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": FUZZ_GROUP,
                                                    **queue_fields}),
        request(RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": FUZZ_GROUP,
                                                     "commitOffset": 1, **queue_fields}),
        request(RequestCode.GET_MAX_OFFSET, queue_fields),
        request(RequestCode.GET_MIN_OFFSET, queue_fields),
        request(RequestCode.GET_EARLIEST_MSG_STORETIME, queue_fields),
        request(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, {**queue_fields, "timestamp": 1}),
        request(RequestCode.QUERY_MESSAGE, {"topic": FUZZ_TOPIC, "key": "fuzz", "maxNum": 32,
                                            "beginTimestamp": 0, "endTimestamp": 2**62}),
        request(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": 0}),
        request(RequestCode.LOCK_BATCH_MQ, body=locks),
        request(RequestCode.UNLOCK_BATCH_MQ, body=locks),
        request(RequestCode.GET_ALL_TOPIC_CONFIG),
        request(RequestCode.GET_BROKER_RUNTIME_INFO),
        request(RequestCode.GET_BROKER_CONFIG),
        request(RequestCode.GET_TOPIC_STATS_INFO, {"topic": FUZZ_TOPIC}),
        request(RequestCode.GET_CONSUME_STATS, {"consumerGroup": FUZZ_GROUP,
                                                "topic": FUZZ_TOPIC}),
        request(RequestCode.GET_ALL_CONSUMER_OFFSET),
        request(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG),
        request(RequestCode.GET_TOPIC_CONFIG, {"topic": FUZZ_TOPIC}),
        request(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": FUZZ_TOPIC, "readQueueNums": 4,
                                                      "writeQueueNums": 4, "perm": 6}),
        request(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                body=json.dumps({"groupName": FUZZ_GROUP, "retryMaxTimes": 3}).encode()),
        request(RequestCode.CONSUMER_SEND_MSG_BACK, {"offset": 0, "group": FUZZ_GROUP,
                                                     "delayLevel": 1, "originTopic": FUZZ_TOPIC,
                                                     "maxReconsumeTimes": 2}),
        request(RequestCode.END_TRANSACTION, {"producerGroup": FUZZ_PRODUCERS,
                                              "tranStateTableOffset": 0,
                                              "commitLogOffset": 0, "commitOrRollback": 12,
                                              "fromTransactionCheck": False, "msgId": "x"}),
        request(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": FUZZ_TOPIC}),
        request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": FUZZ_TOPIC}),
    ])


def namesrv_templates() -> list[RemotingCommand]:
    """Valid requests to a name server, naming only the fuzzer's broker, cluster, topic and
    KV namespace."""
    wrapper = TopicConfigSerializeWrapper({FUZZ_TOPIC: TopicConfig(FUZZ_TOPIC, 4, 4)},
                                          DataVersion(1, 1))
    body = RegisterBrokerBody(wrapper, ())
    registration = {"brokerName": FUZZ_BROKER, "brokerAddr": "127.0.0.1:9",
                    "clusterName": FUZZ_CLUSTER, "haServerAddr": "127.0.0.1:10",
                    "brokerId": 0}
    json_body = body.encode()
    compressed = body.encode(compressed=True)
    request = RemotingCommand.request
    return _both_encodings([
        request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": FUZZ_TOPIC}),
        request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": FUZZ_TOPIC}, version=500),
        request(RequestCode.GET_BROKER_CLUSTER_INFO),
        request(RequestCode.REGISTER_BROKER, {**registration, "compressed": False,
                                              "bodyCrc32": rec.body_crc(json_body)}, json_body),
        request(RequestCode.REGISTER_BROKER, {**registration, "compressed": True,
                                              "bodyCrc32": rec.body_crc(compressed)},
                compressed),
        request(RequestCode.UNREGISTER_BROKER, registration),
        request(RequestCode.QUERY_DATA_VERSION, registration, DataVersion(1, 1).encode()),
        request(RequestCode.PUT_KV_CONFIG, {"namespace": "fuzz", "key": "k", "value": "v"}),
        request(RequestCode.GET_KV_CONFIG, {"namespace": "fuzz", "key": "k"}),
        request(RequestCode.DELETE_KV_CONFIG, {"namespace": "fuzz", "key": "k"}),
        request(RequestCode.GET_KVLIST_BY_NAMESPACE, {"namespace": "fuzz"}),
        request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER),
        request(RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": FUZZ_CLUSTER}),
        request(RequestCode.GET_NAMESRV_CONFIG),
        request(RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": FUZZ_TOPIC}),
    ])


# ---- mutations of remoting frames ------------------------------------------------------------

_HEAD = struct.Struct(">iI")
#: values a length or number field is set to: the edges of every integer width
EDGE_VALUES = (0, 1, -1, 4, 5, 8, 0x7F, 0x80, 0xFF, 0x7FFF, 0xFFFF, 0xFFFFFF, 0x1000000 - 3,
               16 * 1024 * 1024, 2**31 - 1, -(2**31), 2**32 - 1)
HOSTILE_TEXT = ("", "-1", "-9223372036854775809", "9223372036854775808", "2147483648", "1e9",
                "0x10", " 7", "NaN", "true", "null", "\u0000", "\ud800", "\u202e" * 3,
                "x" * 5000, "../../etc", "%RETRY%" + FUZZ_GROUP, "*", "|| ||", "{\"a\":1}")


def _frame(command: RemotingCommand) -> bytes:
    return encode(command)


def _reframe(serialize_type: int, header: bytes, body: bytes) -> bytes:
    """A frame around ``header`` and ``body`` with every length right."""
    word = ((serialize_type & 0xFF) << 24) | (len(header) & 0xFFFFFF)
    return _HEAD.pack(4 + len(header) + len(body), word) + header + body


def _split(frame: bytes) -> tuple[int, bytes, bytes]:
    (_total, word) = _HEAD.unpack_from(frame)
    header_length = word & 0xFFFFFF
    return word >> 24, frame[8:8 + header_length], frame[8 + header_length:]


def flip_bits(rng: random.Random, data: bytes, flips: int) -> bytes:
    out = bytearray(data)
    for _ in range(flips):
        if out:
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    return bytes(out)


def _json_corruption(rng: random.Random, header: bytes) -> bytes:
    """A JSON header with one thing wrong in its JSON, not in its framing."""
    document = json.loads(header)
    choice = rng.randrange(9)
    key = rng.choice(["code", "flag", "opaque", "version", "language", "remark", "extFields",
                      "serializeTypeCurrentRPC"])
    if choice == 0:
        document[key] = rng.choice([None, True, "7", 1.5, 2**63, -(2**31) - 1, [], {}, "x" * 300])
    elif choice == 1:
        document.pop(key, None)
    elif choice == 2:
        depth = rng.choice([50, 2000, 100_000])
        return header[:-1] + b',"deep":' + b"[" * depth + b"]" * depth + b"}"
    elif choice == 3:
        return header[:rng.randrange(1, len(header))]  # cut inside the JSON
    elif choice == 4:
        return header.replace(b'"code":', b'"code":NaN,"c":', 1)
    elif choice == 5:
        ext = document.get("extFields") or {}
        ext[rng.choice(list(ext) or ["k"])] = rng.choice(
            [None, 1, -1, 2**64, 1.25, True, [1], {"a": 1}])
        document["extFields"] = ext
    elif choice == 6:
        document["extFields"] = {f"k{i}": "v" for i in range(rng.choice([1025, 3000]))}
    elif choice == 7:
        return header[:-1] + b',"x":"\xff\xfe\xc3"}'  # not UTF-8
    else:
        return header + header  # two documents
    return json.dumps(document).encode()


def _ext_values(rng: random.Random, command: RemotingCommand) -> RemotingCommand:
    """The same request with some custom header values made hostile, or one of them left
    out (a valid frame: only the handler can refuse it)."""
    fields = dict(command.ext_fields)
    names = sorted(fields)
    for key in rng.sample(names, k=min(len(names), rng.randint(1, 3))):
        fields[key] = rng.choice(HOSTILE_TEXT)
    if names and rng.random() < 0.2:
        del fields[rng.choice(names)]
    return attrs.evolve(command, ext_fields=fields)


def _body_mutation(rng: random.Random, body: bytes) -> bytes:
    choice = rng.randrange(5)
    if choice == 0 and body:
        return flip_bits(rng, body, rng.randint(1, 8))
    if choice == 1 and body:
        return body[:rng.randrange(len(body))]
    if choice == 2:
        return rng.randbytes(rng.randint(0, 600))
    if choice == 3:
        return json.dumps(rng.choice([[], {}, None, "x", 1, {"mqSet": [1] * 5000},
                                      {"consumerDataSet": [{}] * 3}])).encode()
    return zlib.compress(rng.randbytes(64)) + body


#: (name, weight, mutation): a mutation gets the rng and a template, returns the bytes to
#: send, and whether the connection's framing is lost afterwards (the rest of the session
#: goes to the node all the same: what it does then is part of the test)
RemotingMutation = Callable[[random.Random, RemotingCommand, Sequence[RemotingCommand]], bytes]


def _m_valid(rng: random.Random, command: RemotingCommand, _: Sequence[RemotingCommand]) -> bytes:
    return _frame(command)


def _m_bit_flips(rng: random.Random, command: RemotingCommand,
                 _: Sequence[RemotingCommand]) -> bytes:
    return flip_bits(rng, _frame(command), rng.randint(1, 8))


def _m_truncated(rng: random.Random, command: RemotingCommand,
                 _: Sequence[RemotingCommand]) -> bytes:
    frame = _frame(command)
    return frame[:rng.randrange(1, len(frame))]


def _m_total_length(rng: random.Random, command: RemotingCommand,
                    _: Sequence[RemotingCommand]) -> bytes:
    frame = bytearray(_frame(command))
    total = len(frame) - 4
    value = rng.choice([*EDGE_VALUES, total + rng.randint(-8, 8)])
    struct.pack_into(">I", frame, 0, value & 0xFFFFFFFF)
    return bytes(frame)


def _m_header_word(rng: random.Random, command: RemotingCommand,
                   _: Sequence[RemotingCommand]) -> bytes:
    frame = bytearray(_frame(command))
    (word,) = struct.unpack_from(">I", frame, 4)
    if rng.random() < 0.5:
        word = (word & 0xFFFFFF) | (rng.choice([0, 1, 2, 0x7F, 0xFF]) << 24)
    else:
        word = (word & 0xFF000000) | (rng.choice(EDGE_VALUES) & 0xFFFFFF)
    struct.pack_into(">I", frame, 4, word)
    return bytes(frame)


def _m_random_bytes(rng: random.Random, command: RemotingCommand,
                    _: Sequence[RemotingCommand]) -> bytes:
    return rng.randbytes(rng.randint(1, 512))


def _m_header_json(rng: random.Random, command: RemotingCommand,
                   _: Sequence[RemotingCommand]) -> bytes:
    json_command = attrs.evolve(command, serialize_type=SerializeType.JSON)
    stype, header, body = _split(_frame(json_command))
    return _reframe(stype, _json_corruption(rng, header), body)


#: where the binary header keeps its remark length (after code, language, version, opaque
#: and flag)
_REMARK_LENGTH_AT = 13


def _m_binary_header(rng: random.Random, command: RemotingCommand,
                     _: Sequence[RemotingCommand]) -> bytes:
    """A ROCKETMQ binary header with a length inside it (the remark's or the extFields')
    set to an edge value, or bits flipped; the frame around it is right."""
    binary = attrs.evolve(command, serialize_type=SerializeType.ROCKETMQ)
    stype, header, body = _split(_frame(binary))
    mutable = bytearray(header)
    choice = rng.randrange(3)
    if choice < 2:
        (remark_length,) = struct.unpack_from(">i", mutable, _REMARK_LENGTH_AT)
        at = _REMARK_LENGTH_AT if choice == 0 else _REMARK_LENGTH_AT + 4 + remark_length
        struct.pack_into(">I", mutable, at, rng.choice(EDGE_VALUES) & 0xFFFFFFFF)
    else:
        mutable = bytearray(flip_bits(rng, header, rng.randint(1, 6)))
    return _reframe(stype, bytes(mutable), body)


def _m_ext_values(rng: random.Random, command: RemotingCommand,
                  _: Sequence[RemotingCommand]) -> bytes:
    return _frame(_ext_values(rng, command))


def _m_body(rng: random.Random, command: RemotingCommand,
            _: Sequence[RemotingCommand]) -> bytes:
    stype, header, body = _split(_frame(command))
    return _reframe(stype, header, _body_mutation(rng, body))


def _m_code(rng: random.Random, command: RemotingCommand,
            templates: Sequence[RemotingCommand]) -> bytes:
    """Another request's code on this request's fields and body."""
    code = rng.choice([rng.choice(templates).code, rng.randint(-5, 2000), 2**15 - 1])
    return _frame(attrs.evolve(command, code=code, flag=rng.choice([0, 0, 1, 2, 3, -1])))


def _m_repeated(rng: random.Random, command: RemotingCommand,
                _: Sequence[RemotingCommand]) -> bytes:
    return _frame(command) * rng.randint(2, 64)


def _m_spliced(rng: random.Random, command: RemotingCommand,
               templates: Sequence[RemotingCommand]) -> bytes:
    first, second = _frame(command), _frame(rng.choice(templates))
    return first[:rng.randrange(1, len(first))] + second[rng.randrange(len(second)):]


#: every mutation, with its weight
REMOTING_MUTATIONS: tuple[tuple[str, int, RemotingMutation], ...] = (
    ("valid", 2, _m_valid),
    ("bit flips", 4, _m_bit_flips),
    ("truncated", 2, _m_truncated),
    ("total length", 3, _m_total_length),
    ("header length and type", 3, _m_header_word),
    ("random bytes", 2, _m_random_bytes),
    ("JSON header", 4, _m_header_json),
    ("binary header", 3, _m_binary_header),
    ("extFields values", 5, _m_ext_values),
    ("body", 4, _m_body),
    ("request code", 2, _m_code),
    ("repeated", 1, _m_repeated),
    ("spliced", 2, _m_spliced),
)
#: the mutations that keep the frames whole: the node reads on after each, so a session of
#: these reaches the request handlers frame after frame instead of ending at the first
#: frame that breaks the framing (half the sessions are of these only)
WHOLE_FRAME_MUTATIONS = tuple(m for m in REMOTING_MUTATIONS
                              if m[0] in {"valid", "extFields values", "body", "request code",
                                          "repeated"})


# ---- mutations of HA streams -----------------------------------------------------------------


def report_stream(rng: random.Random) -> list[int]:
    """A slave's valid-looking reports: a request, then acks that never go backwards."""
    start = rng.choice([0, 0, rng.randrange(1 << 20), 1 << 20, 2**62])
    acks = sorted(start + rng.randrange(1 << 16) for _ in range(rng.randint(0, 4)))
    return [start, *acks]


def mutate_reports(rng: random.Random) -> tuple[str, bytes]:
    reports = report_stream(rng)
    valid = b"".join(REPORT.pack(r) for r in reports)
    choice = rng.randrange(7)
    if choice == 0:
        return "valid", valid
    if choice == 1:
        return "bit flips", flip_bits(rng, valid, rng.randint(1, 4))
    if choice == 2:
        return "truncated", valid[:rng.randrange(1, len(valid))]
    if choice == 3:
        return "random bytes", rng.randbytes(rng.randint(1, 256))
    if choice == 4:
        edges = [-1, -(2**63), INT64_MAX, 2**62, 1 << 40]
        return "edge offsets", b"".join(REPORT.pack(rng.choice([*edges, *reports]))
                                        for _ in range(len(reports) + 1))
    if choice == 5:
        return "backwards", b"".join(REPORT.pack(r) for r in reversed(reports)) + REPORT.pack(0)
    return "repeated", valid * rng.randint(2, 2000)


def master_frames(rng: random.Random) -> bytes:
    """A master's valid-looking frames: heartbeats and data frames at offsets that follow."""
    offset = rng.choice([0, 1 << 20, rng.randrange(1 << 30)])
    out = []
    for _ in range(rng.randint(1, 4)):
        size = rng.choice([0, 0, rng.randint(1, 64)])
        out.append(FRAME_HEADER.pack(offset, size) + rng.randbytes(size))
        offset += size
    return b"".join(out)


def would_start_a_log(stream: bytes) -> bool:
    """Whether an empty slave would take ``stream`` as the start of its log (a data frame it
    accepts before any protocol error): the stream would write. The slave's own decoder
    decides."""
    protocol = SlaveProtocol()
    protocol.receive_data(stream)
    try:
        for _ in range(len(stream) + 1):
            event = protocol.next_event()
            if event is NEED_DATA:
                return False
            if isinstance(event, FrameHeader) and event.size > 0:
                return True
    except WireError:
        return False
    return False


def mutate_master_frames(rng: random.Random) -> tuple[str, bytes]:
    """Mutated master frames that never start an empty slave's log (see the module's
    docstring); tries a few draws, then falls back to a header that is out of range."""
    for _ in range(16):
        valid = master_frames(rng)
        choice = rng.randrange(6)
        if choice == 0:
            name, data = "bit flips", flip_bits(rng, valid, rng.randint(1, 6))
        elif choice == 1:
            name, data = "truncated", valid[:rng.randrange(1, len(valid))]
        elif choice == 2:
            name, data = "random bytes", rng.randbytes(rng.randint(1, 128))
        elif choice == 3:
            size = rng.choice([-1, -(2**31), 2**31 - 1, 64 * 1024 * 1024 + 1])
            name, data = "size out of range", FRAME_HEADER.pack(rng.randrange(1 << 20), size)
        elif choice == 4:
            offset = rng.choice([-1, -(2**63), INT64_MAX])
            name, data = "offset out of range", FRAME_HEADER.pack(offset, rng.randint(0, 16))
        else:
            name, data = "heartbeats", b"".join(
                FRAME_HEADER.pack(rng.randrange(2**62), 0) for _ in range(rng.randint(1, 50)))
        if not would_start_a_log(data):
            return name, data
    return "size out of range", FRAME_HEADER.pack(0, -1)


# ---- the draw: the next frame for a target ---------------------------------------------------


@attrs.define
class Fuzzer:
    """Seeded mutations for one target kind; ``next_frame`` draws the next frame to send."""

    kind: TargetKind
    rng: random.Random
    templates: list[RemotingCommand] = attrs.field(factory=list)

    @classmethod
    def for_target(cls, target: FuzzTarget, seed: int) -> Fuzzer:
        rng = random.Random(f"{seed}:{target.name}")
        if target.kind is TargetKind.BROKER:
            return cls(target.kind, rng, broker_templates())
        if target.kind is TargetKind.NAMESRV:
            return cls(target.kind, rng, namesrv_templates())
        return cls(target.kind, rng)

    def next_frame(self, *, whole_frames: bool = False) -> tuple[str, bytes]:
        """(mutation name, bytes) of the next thing to send; ``whole_frames``: only
        mutations that keep the framing (WHOLE_FRAME_MUTATIONS)."""
        if self.kind is TargetKind.HA_MASTER:
            return mutate_reports(self.rng)
        mutations = WHOLE_FRAME_MUTATIONS if whole_frames else REMOTING_MUTATIONS
        (name, _, mutation), = self.rng.choices(mutations, [m[1] for m in mutations])
        command = self.rng.choice(self.templates)
        return name, mutation(self.rng, command, self.templates)

