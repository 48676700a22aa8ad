"""Every decoder of the wire layer, fed random bytes and mutations of valid encodings: it
decodes, or it raises its module's typed error (a ``WireError``), and nothing else.

Why: each of these decoders reads bytes a peer chose (a frame, a header, a record in a pull
body, a JSON body, a replication stream), and the servers catch only ``WireError`` around
them (DESIGN §7). Anything else — an IndexError from a short buffer, a TypeError from a JSON
value of the wrong type, a RecursionError from deep nesting — would escape as a crash of the
connection's task with a traceback, or worse. The codec tests elsewhere check that valid
input round-trips; these check that invalid input fails the one expected way.

Inputs are of three kinds: random bytes; a valid encoding with bytes flipped, cut out,
inserted or repeated; and, for JSON bodies, a valid document with a value somewhere inside
replaced by a random JSON value (which reaches the type checks a byte mutation rarely gets
past the parser to). max_examples stays moderate: the file is a sweep that runs in seconds,
not a soak.
"""

from __future__ import annotations

import json
import random
import struct
import zlib
from collections.abc import Callable
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_ha import _backend
from trio_ha.wire import record as rec
from trio_ha.wire.errors import HeaderFieldError, RemotingDecodeError, WireError
from trio_ha.wire.fastjson import read_json, read_json_object_keys
from trio_ha.wire.ha import NEED_DATA, HAProtocolError, MasterProtocol, SlaveProtocol
from trio_ha.wire.heartbeat import (
    ConsumerData,
    ConsumerIdList,
    HeartbeatData,
    ProducerData,
    SubscriptionData,
)
from trio_ha.wire.metadata import (
    ConsumerOffsetTable,
    DataVersion,
    DelayOffsetTable,
    SubscriptionGroupConfig,
    SubscriptionGroupWrapper,
    TopicConfig,
    TopicConfigSerializeWrapper,
    decode_consumer_offsets,
    decode_delay_offsets,
    decode_subscription_groups,
    decode_topics_json,
    encode_consumer_offsets,
    encode_delay_offsets,
    encode_subscription_groups,
    encode_topics_json,
)
from trio_ha.wire.queue_locks import LockBatchRequest, LockBatchResponse, QueueId
from trio_ha.wire.remoting import (
    FrameDecoder,
    PullMessageRequestHeader,
    RemotingCommand,
    RequestCode,
    SendMessageRequestHeader,
    SerializeType,
    encode,
    encode_pull_message_fields,
    encode_send_message_fields,
    encode_send_message_v2_fields,
    pull_message_header,
    send_message_header,
)
from trio_ha.wire.remoting.serialize import decode_binary_header, decode_json_header
from trio_ha.wire.route import (
    BrokerData,
    ClusterInfo,
    KVConfigTable,
    KVTable,
    QueueData,
    RegisterBrokerBody,
    TopicList,
    TopicRouteData,
)
from trio_ha.wire.stats import ConsumeStats, TopicStats

SWEEP = settings(max_examples=150, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
#: for the decoders fed from many valid documents: more examples, each cheap
WIDE_SWEEP = settings(SWEEP, max_examples=300)


# ---- mutations ---------------------------------------------------------------------------------


def mutate(data: bytes, seed: int, rounds: int) -> bytes:
    """``data`` after ``rounds`` random edits: a bit flipped, a byte set, a range cut out,
    random bytes inserted, a range repeated, the end cut off."""
    rng = random.Random(seed)
    out = bytearray(data)
    for _ in range(rounds):
        edit = rng.randrange(6)
        at = rng.randint(0, len(out))
        if edit == 0 and out:
            i = rng.randrange(len(out))
            out[i] ^= 1 << rng.randrange(8)
        elif edit == 1 and out:
            out[rng.randrange(len(out))] = rng.choice((0, 0x7F, 0x80, 0xFF, rng.randrange(256)))
        elif edit == 2:
            del out[at:at + rng.randint(1, 16)]
        elif edit == 3:
            out[at:at] = rng.randbytes(rng.randint(1, 16))
        elif edit == 4 and out:
            start = rng.randrange(len(out))
            out[at:at] = out[start:start + rng.randint(1, 32)]
        else:
            del out[rng.randint(0, len(out)):]
    return bytes(out)


def json_values(max_leaves: int = 12) -> st.SearchStrategy[Any]:
    scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
               | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12))
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                     max_size=4),
        max_leaves=max_leaves,
    )


def replace_somewhere(document: Any, replacement: Any, seed: int) -> Any:
    """``document`` (parsed JSON) with one value at a random place — the root, an object's
    value, an array's item — replaced by ``replacement``."""
    rng = random.Random(seed)
    places: list[tuple[Any, Any]] = [(None, None)]

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key in node:
                places.append((node, key))
                walk(node[key])
        elif isinstance(node, list):
            for i, item in enumerate(node):
                places.append((node, i))
                walk(item)

    walk(document)
    container, key = rng.choice(places)
    if container is None:
        return replacement
    container[key] = replacement
    return document


def only_typed_errors(decode: Callable[[Any], object], data: Any,
                      error: type[WireError] = WireError) -> None:
    """``decode(data)`` returns, or raises ``error``; anything else fails the test."""
    try:
        decode(data)
    except error:
        pass


# ---- remoting frames, headers and custom headers ------------------------------------------------


def remoting_commands() -> list[RemotingCommand]:
    send = SendMessageRequestHeader(
        producer_group="pg", topic="T", default_topic="TBW102", default_topic_queue_nums=4,
        queue_id=1, sys_flag=0, born_timestamp=1_700_000_000_000, flag=0,
        properties="KEYS\x01k\x02TAGS\x01a", reconsume_times=0, batch=True, broker_name="b")
    pull = PullMessageRequestHeader(
        consumer_group="cg", topic="T", queue_id=0, queue_offset=5, max_msg_nums=32,
        sys_flag=2, commit_offset=0, suspend_timeout_millis=15000, subscription="*",
        sub_version=1, expression_type="TAG")
    heartbeat = HeartbeatData("client@1", [ProducerData("pg")], [ConsumerData(
        "cg", "CONSUME_PASSIVELY", "CLUSTERING", "CONSUME_FROM_LAST_OFFSET",
        [SubscriptionData("T", "a || b", {"a", "b"}, {97, 98}, 3)])])
    commands = []
    for stype in SerializeType:
        commands += [
            RemotingCommand.request(RequestCode.SEND_MESSAGE, encode_send_message_fields(send),
                                    b"hello", opaque=1, serialize_type=stype),
            RemotingCommand.request(RequestCode.SEND_MESSAGE_V2,
                                    encode_send_message_v2_fields(send), b"x" * 40, opaque=2,
                                    serialize_type=stype),
            RemotingCommand.request(RequestCode.PULL_MESSAGE, encode_pull_message_fields(pull),
                                    opaque=3, serialize_type=stype),
            RemotingCommand.request(RequestCode.HEART_BEAT, body=heartbeat.encode(), opaque=4,
                                    serialize_type=stype),
            RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"},
                                    opaque=5, serialize_type=stype, remark="r\u00e9mark"),
            RemotingCommand(RequestCode.UPDATE_CONSUMER_OFFSET, flag=1, remark="ok",
                            ext_fields={"n": "-1", "b": "true"}, serialize_type=stype),
        ]
    return commands


SEND_CODES = (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2,
              RequestCode.SEND_BATCH_MESSAGE)
VALID_FRAMES = [encode(command) for command in remoting_commands()]


def feed_frames(stream: bytes, chunk_seed: int) -> None:
    """Feed ``stream`` to a FrameDecoder in random chunks, decoding whatever it yields and
    reading every custom header a handler would read from it."""
    rng = random.Random(chunk_seed)
    decoder = FrameDecoder()
    pos = 0
    while pos < len(stream):
        n = rng.randint(1, 96)
        decoder.receive_data(stream[pos:pos + n])
        pos += n
        while (command := decoder.next_command()) is not NEED_DATA:
            assert isinstance(command, RemotingCommand)
            assert all(type(k) is str and type(v) is str
                       for k, v in command.ext_fields.items())
            # a handler reads its custom header by its own request code: any code's fields
            # may be there, in any shape
            only_typed_errors(pull_message_header, command, HeaderFieldError)
            as_send = attrs.evolve(command, code=SEND_CODES[command.opaque % len(SEND_CODES)])
            only_typed_errors(send_message_header, as_send, HeaderFieldError)
            for name in list(command.ext_fields)[:4]:
                for accessor in (command.field_int, command.field_long, command.field_bool,
                                 command.field_str):
                    only_typed_errors(accessor, name, HeaderFieldError)


@SWEEP
@given(data=st.binary(max_size=600), chunk_seed=st.integers(0, 2**32))
def test_the_frame_decoder_on_random_bytes(data, chunk_seed):
    only_typed_errors(lambda d: feed_frames(d, chunk_seed), data, RemotingDecodeError)


@WIDE_SWEEP
@given(frames=st.lists(st.sampled_from(VALID_FRAMES), min_size=1, max_size=3),
       seed=st.integers(0, 2**32), rounds=st.integers(1, 8))
def test_the_frame_decoder_on_mutated_frames(frames, seed, rounds):
    stream = mutate(b"".join(frames), seed, rounds)
    only_typed_errors(lambda d: feed_frames(d, seed), stream, RemotingDecodeError)


@st.composite
def framed_header_mutations(draw):
    """A JSON or binary header, mutated, in a frame whose lengths are right again: the
    mutation reaches the header decoder instead of failing the framing."""
    command = draw(st.sampled_from(remoting_commands()))
    frame = encode(command)
    header_length = struct.unpack_from(">I", frame, 4)[0] & 0xFFFFFF
    header = frame[8:8 + header_length]
    body = frame[8 + header_length:]
    if command.serialize_type is SerializeType.JSON and draw(st.booleans()):
        document = json.loads(header)
        document = replace_somewhere(document, draw(json_values()), draw(st.integers(0, 2**32)))
        header = json.dumps(document).encode()
    else:
        header = mutate(header, draw(st.integers(0, 2**32)), draw(st.integers(1, 6))) or b"{"
    word = (command.serialize_type.value << 24) | len(header)
    return struct.pack(">iI", 4 + len(header) + len(body), word) + header + body


@WIDE_SWEEP
@given(frame=framed_header_mutations(), chunk_seed=st.integers(0, 2**32))
def test_the_frame_decoder_on_well_framed_mutated_headers(frame, chunk_seed):
    only_typed_errors(lambda d: feed_frames(d, chunk_seed), frame, RemotingDecodeError)


@SWEEP
@given(data=st.binary(max_size=300))
def test_the_header_decoders_on_random_bytes(data):
    only_typed_errors(decode_json_header, data, RemotingDecodeError)
    only_typed_errors(lambda d: decode_binary_header(d, 0, len(d)), data, RemotingDecodeError)


@SWEEP
@given(document=json_values(20))
def test_the_json_header_decoder_on_any_json_value(document):
    only_typed_errors(decode_json_header, json.dumps(document).encode(), RemotingDecodeError)
    if isinstance(document, dict):
        with_code = {"code": 10, **document, "extFields": document}
        only_typed_errors(decode_json_header, json.dumps(with_code).encode(),
                          RemotingDecodeError)


# ---- HA frames and reports ---------------------------------------------------------------------


def valid_slave_stream() -> bytes:
    return b"".join(struct.pack(">q", offset) for offset in (0, 100, 100, 250, 4096))


def valid_master_stream() -> bytes:
    return (struct.pack(">qi", 0, 0) + struct.pack(">qi", 0, 5) + b"hello"
            + struct.pack(">qi", 5, 0) + struct.pack(">qi", 5, 3) + b"abc")


def drain_ha(protocol: MasterProtocol | SlaveProtocol, stream: bytes, chunk_seed: int) -> None:
    rng = random.Random(chunk_seed)
    pos = 0
    while pos < len(stream):
        n = rng.randint(1, 20)
        protocol.receive_data(stream[pos:pos + n])
        pos += n
        for _ in range(len(stream) + 1):  # each event consumes bytes: bounded by the input
            if protocol.next_event() is NEED_DATA:
                break


def ha_protocols() -> list[Callable[[], MasterProtocol | SlaveProtocol]]:
    return [lambda: MasterProtocol(log_end=2**62), lambda: MasterProtocol(log_end=0),
            SlaveProtocol, lambda: SlaveProtocol(expected=0), lambda: SlaveProtocol(expected=5),
            lambda: SlaveProtocol(max_frame_body=4)]


@SWEEP
@given(data=st.binary(max_size=200), chunk_seed=st.integers(0, 2**32))
def test_the_ha_protocols_on_random_bytes(data, chunk_seed):
    for make in ha_protocols():
        only_typed_errors(lambda d, make=make: drain_ha(make(), d, chunk_seed), data,
                          HAProtocolError)


@WIDE_SWEEP
@given(which=st.sampled_from(["slave", "master"]), seed=st.integers(0, 2**32),
       rounds=st.integers(1, 6))
def test_the_ha_protocols_on_mutated_streams(which, seed, rounds):
    stream = mutate(valid_slave_stream() if which == "slave" else valid_master_stream(), seed,
                    rounds)
    for make in ha_protocols():
        only_typed_errors(lambda d, make=make: drain_ha(make(), d, seed), stream,
                          HAProtocolError)


# ---- records, batches, message ids, properties -------------------------------------------------


def valid_records() -> list[bytes]:
    records = []
    properties = rec.Message("Topic", b"", tags="a", keys="k",
                             properties={"UNIQ_KEY": "ABC"}).encoded_properties()
    for version, host_name in ((1, "127.0.0.1"), (2, "127.0.0.1"), (1, "::1")):
        host = rec.encode_host(host_name, 10911)
        records.append(rec.encode_record(
            topic=b"Topic", body=b"body" * 8, properties=properties, queue_id=1, flag=0,
            queue_offset=7, commitlog_offset=4096, sys_flag=0, born_timestamp=1,
            born_host=host, store_timestamp=2, store_host=host, version=version))
    return records


VALID_RECORDS = valid_records()
VALID_BATCH = rec.encode_batch([rec.Message("T", b"one", tags="a"), rec.Message("T", b"two")])


def decode_every_record(data: bytes) -> None:
    """Decode records one after another, as a client reads a pull body."""
    view = memoryview(data)
    for _ in range(len(data)):
        if not view:
            return
        message = rec.decode_record(view, check_crc=True)
        view = view[message.size:]


@SWEEP
@given(data=st.binary(max_size=400))
def test_the_record_decoders_on_random_bytes(data):
    only_typed_errors(decode_every_record, data, rec.RecordDecodeError)
    only_typed_errors(rec.decode_batch, data, rec.RecordDecodeError)
    assert isinstance(rec.decode_properties(data), dict)  # never raises at all
    only_typed_errors(lambda d: _backend.engine.decode_records(d, extra_properties={}), data,
                      rec.RecordDecodeError)


@WIDE_SWEEP
@given(records=st.lists(st.sampled_from(VALID_RECORDS), min_size=1, max_size=3),
       seed=st.integers(0, 2**32), rounds=st.integers(1, 8))
def test_the_record_decoders_on_mutated_records(records, seed, rounds):
    data = mutate(b"".join(records), seed, rounds)
    only_typed_errors(decode_every_record, data, rec.RecordDecodeError)
    only_typed_errors(lambda d: _backend.engine.decode_records(d, extra_properties={"X": "1"}),
                      data, rec.RecordDecodeError)


@SWEEP
@given(seed=st.integers(0, 2**32), rounds=st.integers(1, 8))
def test_the_batch_decoder_on_mutated_batches(seed, rounds):
    only_typed_errors(rec.decode_batch, mutate(VALID_BATCH, seed, rounds), rec.RecordDecodeError)


@SWEEP
@given(text=st.text(max_size=64) | st.text("0123456789ABCDEFabcdef", min_size=30, max_size=58))
def test_the_message_id_decoder_on_any_text(text):
    only_typed_errors(rec.decode_message_id, text, rec.RecordDecodeError)


# ---- JSON bodies -------------------------------------------------------------------------------

QUEUE = QueueId("T", "broker-a", 3)

#: (decoder, a valid encoding): the bodies a peer sends and the config files a store reads
JSON_BODIES: list[tuple[str, Callable[[Any], object], bytes]] = [
    ("TopicRouteData", TopicRouteData.decode, TopicRouteData(
        [QueueData("broker-a", 4, 4)],
        [BrokerData("DefaultCluster", "broker-a", {0: "127.0.0.1:10911", 1: "127.0.0.1:10921"})],
        {"127.0.0.1:10911": ("127.0.0.1:1",)}).encode(standard_json=False)),
    ("TopicRouteData (standard)", TopicRouteData.decode, TopicRouteData(
        [QueueData("broker-a", 4, 4)],
        [BrokerData("c", "broker-a", {0: "127.0.0.1:10911"})]).encode(standard_json=True)),
    ("ClusterInfo", ClusterInfo.decode, ClusterInfo(
        {"broker-a": BrokerData("c", "broker-a", {0: "127.0.0.1:10911"})},
        {"c": frozenset({"broker-a"})}).encode()),
    ("RegisterBrokerBody", RegisterBrokerBody.decode, RegisterBrokerBody(
        TopicConfigSerializeWrapper({"T": TopicConfig("T", 4, 4)}, DataVersion(3, 4)),
        ["127.0.0.1:1"]).encode()),
    ("KVTable", KVTable.decode, KVTable({"a": "1", "b": "2"}).encode()),
    ("TopicList", TopicList.decode, TopicList(("A", "B"), "127.0.0.1:1").encode()),
    ("KVConfigTable", KVConfigTable.decode, KVConfigTable({"ns": {"k": "v"}}).encode()),
    ("DataVersion", DataVersion.decode, DataVersion(1, 2, 3).encode()),
    ("topics.json", decode_topics_json, encode_topics_json(TopicConfigSerializeWrapper(
        {"T": TopicConfig("T", 8, 8, order=True)}, DataVersion(5, 6)))),
    ("consumerOffset.json", decode_consumer_offsets, encode_consumer_offsets(
        ConsumerOffsetTable({"T@cg": {0: 5, 1: 7}}, DataVersion(1, 1)))),
    ("delayOffset.json", decode_delay_offsets, encode_delay_offsets(
        DelayOffsetTable({1: 5, 2: 9}))),
    ("subscriptionGroup.json", decode_subscription_groups, encode_subscription_groups(
        SubscriptionGroupWrapper({"cg": SubscriptionGroupConfig("cg")}, DataVersion(2, 2)))),
    ("HeartbeatData", HeartbeatData.decode, HeartbeatData("c@1", [ProducerData("pg")], [
        ConsumerData("cg", "CONSUME_PASSIVELY", "CLUSTERING", "CONSUME_FROM_LAST_OFFSET",
                     [SubscriptionData("T", "a", {"a"}, {97})])]).encode()),
    ("ConsumerIdList", ConsumerIdList.decode, ConsumerIdList(("a", "b")).encode()),
    ("LockBatchRequest", LockBatchRequest.decode,
     LockBatchRequest("cg", "c@1", (QUEUE,)).encode()),
    ("LockBatchResponse", LockBatchResponse.decode, LockBatchResponse((QUEUE,)).encode()),
    ("TopicStats", TopicStats.decode,
     b'{"offsetTable":{{"brokerName":"broker-a","queueId":3,"topic":"T"}:'
     b'{"lastUpdateTimestamp":1,"maxOffset":5,"minOffset":0}}}'),
    ("ConsumeStats", ConsumeStats.decode,
     b'{"consumeTps":1.5,"offsetTable":{{"brokerName":"broker-a","queueId":3,"topic":"T"}:'
     b'{"brokerOffset":9,"consumerOffset":4,"lastTimestamp":2}}}'),
    ("read_json", read_json, b'{0:"a","b":[1,2,{3:4}]}'),
    ("read_json_object_keys", read_json_object_keys, b'{{"a":1}:[1,{"b":3}],"x":{2:3}}'),
]
JSON_IDS = [name for name, _, _ in JSON_BODIES]


def test_every_valid_body_decodes():
    for name, decode, body in JSON_BODIES:
        assert decode(body) is not None, name


@pytest.mark.parametrize(("decode", "body"), [(d, b) for _, d, b in JSON_BODIES], ids=JSON_IDS)
@SWEEP
@given(data=st.binary(max_size=200))
def test_json_body_decoders_on_random_bytes(decode, body, data):
    only_typed_errors(decode, data)


@pytest.mark.parametrize(("decode", "body"), [(d, b) for _, d, b in JSON_BODIES], ids=JSON_IDS)
@SWEEP
@given(seed=st.integers(0, 2**32), rounds=st.integers(1, 6))
def test_json_body_decoders_on_mutated_bodies(decode, body, seed, rounds):
    only_typed_errors(decode, mutate(body, seed, rounds))


def parsed(body: bytes) -> Any:
    """A valid body as plain JSON (numeric keys quoted; a body keyed by objects as
    [key, value] pairs, which is JSON too)."""
    try:
        return read_json(body)
    except WireError:
        return json.loads(json.dumps(read_json_object_keys(body)))


@pytest.mark.parametrize(("decode", "body"), [(d, b) for _, d, b in JSON_BODIES], ids=JSON_IDS)
@SWEEP
@given(replacement=json_values(), seed=st.integers(0, 2**32))
def test_json_body_decoders_on_documents_with_a_value_replaced(decode, body, replacement, seed):
    document = replace_somewhere(parsed(body), replacement, seed)
    only_typed_errors(decode, json.dumps(document).encode())


@SWEEP
@given(depth=st.integers(1, 5000), opener=st.sampled_from(["[", "{\"a\":", "{{\"a\":1}:"]))
def test_json_readers_refuse_deep_nesting_with_their_typed_error(depth, opener):
    for read in (read_json, read_json_object_keys):
        only_typed_errors(read, opener * depth)


@SWEEP
@given(seed=st.integers(0, 2**32), rounds=st.integers(1, 6), deflate_first=st.booleans())
def test_the_compressed_register_body_on_mutations(seed, rounds, deflate_first):
    valid = RegisterBrokerBody(
        TopicConfigSerializeWrapper({"T": TopicConfig("T", 4, 4)}, DataVersion(3, 4)),
        ["127.0.0.1:1"]).encode(compressed=True)
    if deflate_first:  # mutate the inflated stream: the mutation reaches the reader
        data = zlib.compress(mutate(zlib.decompress(valid), seed, rounds))
    else:
        data = mutate(valid, seed, rounds)
    only_typed_errors(lambda d: RegisterBrokerBody.decode(d, compressed=True), data)


@SWEEP
@given(topic_text=st.text(max_size=40), count=st.integers(-3, 3))
def test_the_compressed_register_body_with_odd_topic_lines(topic_text, count):
    raw = (struct.pack(">i", len(DataVersion(1, 1).encode())) + DataVersion(1, 1).encode()
           + struct.pack(">i", count)
           + struct.pack(">i", len(topic_text.encode())) + topic_text.encode()
           + struct.pack(">i", 2) + b"[]" + struct.pack(">i", 0))
    data = zlib.compress(raw)
    only_typed_errors(lambda d: RegisterBrokerBody.decode(d, compressed=True), data)
