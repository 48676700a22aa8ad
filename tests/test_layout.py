"""wire/layout.py is the one home of the on-disk layout: its accessors must agree with the
record codec on every shape of record (v1/v2, IPv4/IPv6 hosts), and its file-name rules must
accept exactly what RocketMQ writes."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_ha.wire import layout
from trio_ha.wire import record as rec


def _record(*, tags: str | None, born_v6: bool, store_v6: bool, version_two: bool,
            body: bytes) -> bytes:
    properties = {"KEYS": "k1", **({"TAGS": tags} if tags is not None else {})}
    return rec.encode_record(
        topic=b"LayoutTopic", body=body,
        properties=rec.encode_properties(properties).encode(),
        queue_id=3, flag=0, queue_offset=7, commitlog_offset=4096, sys_flag=0,
        born_timestamp=1_700_000_000_000,
        born_host=rec.encode_host("::1" if born_v6 else "10.0.0.1", 5000),
        store_timestamp=1_700_000_000_123,
        store_host=rec.encode_host("::2" if store_v6 else "10.0.0.2", 10911),
        version=2 if version_two else 1,
    )


@given(
    tags=st.one_of(st.none(), st.text(min_size=1, max_size=20).filter(
        lambda t: "\x01" not in t and "\x02" not in t)),
    born_v6=st.booleans(), store_v6=st.booleans(), version_two=st.booleans(),
    body=st.binary(max_size=300),
)
def test_accessors_agree_with_the_record_codec(tags, born_v6, store_v6, version_two, body):
    raw = _record(tags=tags, born_v6=born_v6, store_v6=store_v6, version_two=version_two,
                  body=body)
    decoded = rec.decode_record(raw)
    assert layout.read_store_timestamp(raw) == decoded.store_timestamp == 1_700_000_000_123
    assert layout.read_sys_flag(raw) == decoded.sys_flag
    properties = rec.decode_properties(bytes(layout.properties_slice(raw)))
    assert properties.get(rec.PROPERTY_TAGS) == decoded.tags == tags
    # A record inside a larger buffer is read at its position.
    assert layout.read_store_timestamp(b"\0" * 11 + raw, 11) == decoded.store_timestamp


def test_properties_slice_of_a_short_buffer_is_short_not_an_error():
    raw = _record(tags="t", born_v6=False, store_v6=False, version_two=False, body=b"x" * 50)
    for cut in (40, layout.FIXED_PART_IPV4, layout.FIXED_PART_IPV4 + 30, len(raw) - 3):
        assert len(layout.properties_slice(raw[:cut])) < len(layout.properties_slice(raw))


def test_segment_names_are_twenty_ascii_digits_exactly():
    assert layout.segment_file_name(6_000_000) == "00000000000006000000"
    assert layout.parse_segment_file_name("00000000000006000000") == 6_000_000
    for name in ("0000000000000600000", "00000000000006000000\n", "00000000000006000000.tmp",
                 "٠" * 20, "abort"):
        assert layout.parse_segment_file_name(name) is None, name


@pytest.mark.parametrize(("sys_flag", "expected"), [
    (0, 56), (layout.SYSFLAG_BORNHOST_V6, 68), (layout.SYSFLAG_STOREHOST_V6, 56),
])
def test_store_timestamp_follows_the_born_host(sys_flag, expected):
    assert layout.store_timestamp_at(sys_flag) == expected


def test_consume_queue_blank_entry():
    assert len(layout.CQ_BLANK_ENTRY) == layout.CQ_ENTRY_SIZE == layout.CQ_ENTRY.size
    assert layout.CQ_ENTRY.unpack(layout.CQ_BLANK_ENTRY) == (0, 0x7FFFFFFF, 0)
