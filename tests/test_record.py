"""The record codec against RocketMQ's own numbers (docs/formats.md, 'Commitlog record')."""

import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_ha.wire import record as rec
from trio_ha.wire.errors import RecordDecodeError

HOST = rec.encode_host("127.0.0.1", 10911)
BODY = b"Once, there was a chance for me!"
KEYS = "1700000000000"  # a 13-digit millisecond timestamp, as RocketMQ's test uses


def golden(properties: bytes, **overrides) -> bytes:
    fields: dict[str, Any] = dict(
        topic=b"FooBar", body=BODY, properties=properties, queue_id=0, flag=4, queue_offset=0,
        commitlog_offset=0, sys_flag=0, born_timestamp=1_700_000_000_000, born_host=HOST,
        store_timestamp=1_700_000_000_001, store_host=HOST,
    )
    fields.update(overrides)
    return rec.encode_record(**fields)


def test_rocketmq_test_record_is_157_bytes_without_trailing_separator():
    message = rec.Message("FooBar", BODY, tags="TAG1", keys=KEYS)
    data = golden(message.encoded_properties())
    assert len(data) == 157
    assert struct.unpack_from(">i", data, 0)[0] == 157


def test_rocketmq_test_record_is_158_bytes_with_trailing_separator():
    message = rec.Message("FooBar", BODY, tags="TAG1", keys=KEYS)
    data = golden(message.encoded_properties(trailing_separator=True))
    assert len(data) == 158
    # Both property encodings decode to the same properties.
    assert rec.decode_record(data).properties == {"TAGS": "TAG1", "KEYS": KEYS}


def test_body_crc_matches_reference_value():
    assert rec.body_crc(BODY) == 151131488
    data = golden(b"")
    assert struct.unpack_from(">i", data, 8)[0] == 151131488


def test_field_positions_match_reference_layout():
    data = golden(b"TAGS\x01TAG1", queue_id=3, queue_offset=77, commitlog_offset=1234)
    assert struct.unpack_from(">I", data, 4)[0] == rec.MAGIC_V1 == 0xDAA320A7
    assert struct.unpack_from(">i", data, 12)[0] == 3  # QUEUEID
    assert struct.unpack_from(">i", data, 16)[0] == 4  # FLAG
    assert struct.unpack_from(">q", data, 20)[0] == 77  # QUEUEOFFSET
    assert struct.unpack_from(">q", data, 28)[0] == 1234  # PHYSICALOFFSET
    assert struct.unpack_from(">q", data, 56)[0] == 1_700_000_000_001  # STORETIMESTAMP
    assert data[48:56] == HOST and data[64:72] == HOST
    assert struct.unpack_from(">i", data, 84)[0] == len(BODY)
    assert data[88 : 88 + len(BODY)] == BODY
    assert data[88 + len(BODY)] == 6 and data[89 + len(BODY) : 95 + len(BODY)] == b"FooBar"


def test_ipv6_hosts_set_sysflags_and_shift_fields():
    host6 = rec.encode_host("::1", 10911)
    data = golden(b"", born_host=host6, store_host=host6)
    assert len(data) == 91 + len(BODY) + 6 + 24
    sys_flag = struct.unpack_from(">i", data, 36)[0]
    assert sys_flag & rec.SYSFLAG_BORNHOST_V6 and sys_flag & rec.SYSFLAG_STOREHOST_V6
    decoded = rec.decode_record(data)
    assert decoded.born_host == "[::1]:10911" and decoded.store_timestamp == 1_700_000_000_001


def test_v2_record_with_two_byte_topic_length_decodes():
    topic = b"T" * 300
    data = golden(b"", topic=topic, version=2)
    decoded = rec.decode_record(data)
    assert decoded.version == 2 and decoded.topic == "T" * 300


def test_blank_record():
    assert rec.encode_blank(1000) == struct.pack(">iI", 1000, 0xCBD43194)


def test_message_id_layout():
    assert rec.message_id(HOST, 1234) == "7F00000100002A9F00000000000004D2"
    assert rec.decode_message_id("7F00000100002A9F00000000000004D2") == ("127.0.0.1:10911", 1234)
    with pytest.raises(RecordDecodeError):
        rec.decode_message_id("zz")


@pytest.mark.parametrize("host", [HOST, rec.encode_host("::1", 10911)])
@pytest.mark.parametrize("offsets", [(), (1234,), (0, 1234, 2**40 + 7), tuple(range(0, 32_000, 1000))])
def test_joined_message_ids_are_each_records_id_comma_joined(host, offsets):
    joined = rec.joined_message_ids(host, offsets)
    assert joined == ",".join(rec.message_id(host, offset) for offset in offsets)
    assert [rec.decode_message_id(i)[1] for i in joined.split(",") if i] == list(offsets)


def test_tag_hash_is_java_string_hashcode():
    assert rec.tags_code("TAG1") == 2567159
    assert rec.tags_code("TagA") == 2598919
    assert rec.tags_code(None) == 0
    # Overflow wraps as a Java int; non-BMP characters count as two UTF-16 units.
    assert rec.java_string_hash("hello") == 99162322
    assert rec.java_string_hash("Hello World") == -862545276
    assert rec.java_string_hash("\U0001F600") == 31 * 0xD83D + 0xDE00


def test_properties_parse_both_separator_styles_and_drop_empty_pairs():
    assert rec.decode_properties("A\x01x\x02B\x01y") == {"A": "x", "B": "y"}
    assert rec.decode_properties("A\x01x\x02B\x01y\x02") == {"A": "x", "B": "y"}
    assert rec.decode_properties("A\x01\x02\x01v\x02C\x01z\x01w") == {"C": "z\x01w"}


@pytest.mark.parametrize("engine", ["native", "python"])
def test_pulled_properties_are_decoded_on_first_use_with_the_readers_extras_winning(
        engine, monkeypatch):
    """A pull's messages carry their PROPERTIES field as stored and decode it only when
    asked, once (the pull benchmark's consumer never asks: a fifth of its decoding); the
    reader's extras (MIN/MAX_OFFSET) are added over the stored ones, as before."""
    from trio_ha import _backend

    if engine == "native" and not isinstance(_backend.engine, _backend.NativeEngine):
        pytest.skip("the native engine is not built here")
    decoder = _backend.engine if engine == "native" else _backend.PythonEngine()
    stored = {"TAGS": "a", "MIN_OFFSET": "stored", "UNIQ_KEY": "7F00000100"}
    body = b"".join(golden(rec.encode_properties(stored).encode(), queue_offset=i)
                    for i in range(3))
    extra = {"MIN_OFFSET": "0", "MAX_OFFSET": "3"}
    calls = []
    real = rec.decode_properties
    monkeypatch.setattr(rec, "decode_properties", lambda raw: calls.append(raw) or real(raw))
    messages = decoder.decode_records(body, extra_properties=extra)
    assert calls == []
    assert [m.raw_properties for m in messages] == [rec.encode_properties(stored).encode()] * 3
    first = messages[0]
    assert first.properties == {"TAGS": "a", "MIN_OFFSET": "0", "UNIQ_KEY": "7F00000100",
                                "MAX_OFFSET": "3"}
    assert first.properties is first.properties and first.tags == "a"
    assert len(calls) == 1
    assert extra == {"MIN_OFFSET": "0", "MAX_OFFSET": "3"}  # the shared extras untouched


@given(
    body=st.binary(max_size=2048),
    topic=st.from_regex(r"[A-Za-z0-9_%|-]{1,127}", fullmatch=True),
    props=st.dictionaries(
        st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), min_size=1, max_size=8),
        st.text(st.characters(blacklist_characters="\x02", blacklist_categories=("Cs",)), min_size=1, max_size=16),
        max_size=5,
    ),
    queue_id=st.integers(0, 2**31 - 1),
    queue_offset=st.integers(0, 2**63 - 1),
    ipv6=st.booleans(),
)
def test_encode_decode_round_trip(body, topic, props, queue_id, queue_offset, ipv6):
    host = rec.encode_host("::1" if ipv6 else "10.0.0.1", 9876)
    props = {k: v for k, v in props.items() if not v.startswith("\x01")}
    encoded_props = rec.encode_properties(props).encode()
    data = rec.encode_record(
        topic=topic.encode(), body=body, properties=encoded_props, queue_id=queue_id, flag=7,
        queue_offset=queue_offset, commitlog_offset=42, sys_flag=0, born_timestamp=1,
        born_host=host, store_timestamp=2, store_host=host,
    )
    decoded = rec.decode_record(data, check_crc=True)
    assert (decoded.topic, decoded.body, decoded.queue_id, decoded.queue_offset) == (
        topic, body, queue_id, queue_offset,
    )
    assert decoded.properties == props
    assert decoded.size == len(data)


@given(st.binary(max_size=300), st.integers(0, 300))
def test_decoder_rejects_garbage_with_typed_error(data, cut):
    try:
        rec.decode_record(data[:cut])
    except RecordDecodeError:
        pass


def test_decoder_rejects_every_truncation_and_bad_crc():
    data = golden(b"TAGS\x01TAG1")
    for cut in range(len(data)):
        with pytest.raises(RecordDecodeError):
            rec.decode_record(data[:cut])
    flipped = bytearray(data)
    flipped[90] ^= 0xFF
    with pytest.raises(RecordDecodeError, match="CRC"):
        rec.decode_record(bytes(flipped), check_crc=True)
    bad_size = bytearray(data)
    struct.pack_into(">i", bad_size, 0, len(data) - 1)
    with pytest.raises(RecordDecodeError):
        rec.decode_record(bytes(bad_size))


def test_batch_body_round_trip_and_limits():
    messages = [rec.Message("T", b"x" * i, tags="a", properties={"P": str(i)}, flag=i) for i in range(5)]
    body = rec.encode_batch(messages)
    items = rec.decode_batch(body)
    assert [i.body for i in items] == [m.body for m in messages]
    assert [i.flag for i in items] == list(range(5))
    for cut in range(1, len(body)):
        if cut in _item_boundaries(body):
            continue
        with pytest.raises(RecordDecodeError):
            rec.decode_batch(body[:cut])


def _item_boundaries(body: bytes) -> set[int]:
    out, pos = set(), 0
    while pos < len(body):
        pos += struct.unpack_from(">i", body, pos)[0]
        out.add(pos)
    return out
