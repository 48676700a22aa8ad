"""The C core (native/trio_ha_native.c) held against its Python twin.

Every encoder result must be byte-identical to ``_backend.python_engine`` / ``wire.record``,
and every scan must agree with the Python scanner field for field, including where and why it
stops. The module is skipped only when the native module is not built and the run does not
require it (``TRIO_HA_REQUIRE_NATIVE=1`` makes a missing build an import error of _backend).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import random
import select
import socket
import struct
import threading
import zlib

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from trio_ha import _backend as backend
from trio_ha.wire import layout
from trio_ha.wire import record as rec

if backend.native_backend != "native":
    if os.environ.get("TRIO_HA_REQUIRE_NATIVE") == "1":  # pragma: no cover - _backend raises
        pytest.fail("TRIO_HA_REQUIRE_NATIVE=1 but the native module is not loaded")
    pytest.skip(
        f"native module not built ({backend.native_unavailable_reason})", allow_module_level=True
    )

assert isinstance(backend.engine, backend.NativeEngine)
native = backend.engine
py = backend.python_engine
lib = native.lib
ffi = native.ffi

PAGE = mmap.PAGESIZE
FIELDS = backend.RecordInfo.__slots__
MAX_RECORD = rec.DEFAULT_MAX_MESSAGE_SIZE + 64 * 1024
SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

GOLDEN_BODY = b"Once, there was a chance for me!"
GOLDEN_CRC = 151131488


# ---- strategies -----------------------------------------------------------------------------

int32s = st.integers(-(2**31), 2**31 - 1)
int64s = st.integers(-(2**63), 2**63 - 1)
hosts = st.one_of(st.binary(min_size=8, max_size=8), st.binary(min_size=20, max_size=20))


def rand_bytes(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


@st.composite
def bodies(draw, max_size: int = 65536) -> bytes:
    n = draw(st.one_of(st.integers(0, 64), st.integers(0, max_size)))
    return rand_bytes(n, draw(st.integers(0, 2**32)))


prop_names = st.one_of(
    st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "WAIT", "TAG", "TAGSS", "tags", ""]),
    st.text(min_size=1, max_size=8),
)
prop_values = st.one_of(
    st.sampled_from(["", "TAG1", "TagA", "a", "x\x01y", "日本語", "\U0001f600 tag"]),
    st.text(max_size=12),
)


@st.composite
def properties(draw) -> bytes:
    """Well-formed, sloppy and malformed properties (bad UTF-8, stray separators)."""
    kind = draw(st.sampled_from(["dict", "dict", "pairs", "bytes"]))
    if kind == "dict":
        d = draw(st.dictionaries(prop_names.filter(bool), prop_values.filter(bool), max_size=5))
        text = rec.encode_properties(d, trailing_separator=draw(st.booleans()))
        return text.encode("utf-8", "surrogatepass")
    if kind == "pairs":
        pairs = draw(st.lists(st.tuples(prop_names, prop_values), max_size=6))
        parts = []
        for name, value in pairs:
            parts.append(
                name.encode("utf-8", "surrogatepass")
                + draw(st.sampled_from([b"\x01", b"\x01", b""]))
                + value.encode("utf-8", "surrogatepass")
            )
        sep = draw(st.sampled_from([b"\x02", b"\x02", b"\x02\x02"]))
        return sep.join(parts) + draw(st.sampled_from([b"", b"\x02", b"\x02\x02"]))
    raw = draw(st.lists(st.sampled_from([b"\x01", b"\x02", b"TAGS", b"\xff", b"\xe2\x82",
                                         b"\xf0\x9f\x98\x80", b"\xed\xa0\x80", b"a", b"T"]),
                        max_size=12))
    return b"".join(raw)


text_topics = st.text(st.characters(codec="utf-8"), max_size=20).map(str.encode).filter(
    lambda t: len(t) <= 127
)
topics_v1 = st.one_of(text_topics, st.binary(max_size=127))


@st.composite
def record_args(draw, max_body: int = 65536) -> dict:
    return dict(
        topic=draw(topics_v1),
        body=draw(bodies(max_body)),
        props=draw(properties()),
        queue_id=draw(int32s),
        flag=draw(int32s),
        queue_offset=draw(int64s),
        sys_flag=draw(st.one_of(st.integers(0, 0x7FF), int32s)),
        born_ts=draw(int64s),
        born_host=draw(hosts),
        store_ts=draw(int64s),
        store_host=draw(hosts),
        reconsume_times=draw(int32s),
        prepared_offset=draw(int64s),
    )


def encode_with(engine, buf, seg_size, pos, base_offset, a) -> int:
    return engine.encode_record(
        engine.handle_for(buf), seg_size, pos, base_offset, a["topic"], a["body"], a["props"],
        a["queue_id"], a["flag"], a["queue_offset"], a["sys_flag"], a["born_ts"],
        a["born_host"], a["store_ts"], a["store_host"], a["reconsume_times"],
        a["prepared_offset"],
    )


def reference_record(a, commitlog_offset, version=1) -> bytes:
    return rec.encode_record(
        topic=a["topic"], body=a["body"], properties=a["props"], queue_id=a["queue_id"],
        flag=a["flag"], queue_offset=a["queue_offset"], commitlog_offset=commitlog_offset,
        sys_flag=a["sys_flag"], born_timestamp=a["born_ts"], born_host=a["born_host"],
        store_timestamp=a["store_ts"], store_host=a["store_host"],
        reconsume_times=a["reconsume_times"],
        prepared_transaction_offset=a["prepared_offset"], version=version,
    )


def record_size(a) -> int:
    return rec.record_size(len(a["body"]), len(a["topic"]), len(a["props"]),
                           born_host_len=len(a["born_host"]),
                           store_host_len=len(a["store_host"]))


# ---- version, CRC, Java hash ----------------------------------------------------------------


def test_version_matches_python():
    assert lib.th_version() == backend.NATIVE_VERSION


def test_java_hash_known_values():
    assert native.java_hash(b"TAG1") == 2567159
    assert native.java_hash(b"TagA") == 2598919
    assert native.java_hash(b"") == 0
    assert native.java_hash("日本".encode()) == rec.java_string_hash("日本")
    assert native.java_hash("\U0001f600".encode()) == rec.java_string_hash("\U0001f600")


@SETTINGS
@given(st.text(st.characters(codec="utf-8"), max_size=64))
def test_java_hash_matches_python_on_text(text):
    assert native.java_hash(text.encode()) == rec.java_string_hash(text)


@SETTINGS
@given(st.binary(max_size=48))
@example(b"\xff")
@example(b"\xe2\x82")
@example(b"\xe2\x82A")
@example(b"\xe0\x80\x80")
@example(b"\xed\xa0\x80")
@example(b"\xf0\x9f\x98")
@example(b"\xf4\x90\x80\x80")
@example(b"\xc0\xaf")
@example(b"\xf0\x9f\x98\x80\x80")
def test_java_hash_replaces_malformed_utf8_like_python(data):
    assert native.java_hash(data) == py.java_hash(data)


@SETTINGS
@given(st.binary(max_size=4096))
def test_crc32_matches_zlib(data):
    assert native.crc32(data) == zlib.crc32(data) & 0x7FFFFFFF == py.crc32(data)


def test_crc32_golden_and_large():
    assert native.crc32(GOLDEN_BODY) == GOLDEN_CRC
    big = rand_bytes(3 << 20, 7)
    assert native.crc32(big) == zlib.crc32(big) & 0x7FFFFFFF


CRC_IMPLS = list(range(lib.th_crc32_select(-1) + 1))  # 0 zlib, 1 PCLMULQDQ, 2 VPCLMULQDQ
CRC_POOL = rand_bytes(70_000 + 64 + 64, 11)


@pytest.fixture
def crc_impl():
    """Run a test under each CRC-32 implementation this CPU has, then restore the best."""
    best = lib.th_crc32_select(-1)

    def use(impl: int) -> None:
        assert lib.th_crc32_select(impl) == impl
        assert lib.th_crc32_impl() == impl

    yield use
    assert lib.th_crc32_select(-1) == best


def crc_full(data, start: int, length: int, crc: int = 0) -> int:
    return lib.th_crc32_full(crc, ffi.from_buffer(data) + start, length)


def test_crc32_selects_the_best_implementation():
    best = lib.th_crc32_impl()
    assert best == lib.th_crc32_select(-1) == lib.th_crc32_select(99)
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        flags = ""
    if " pclmulqdq" in flags and " sse4_1" in flags and os.uname().machine == "x86_64":
        assert best >= 1
        if " vpclmulqdq" in flags and " avx512f" in flags and " avx512vl" in flags:
            assert best == 2


@settings(SETTINGS, max_examples=300)
@given(
    st.one_of(st.integers(0, 300), st.integers(0, 4200), st.integers(0, 70_000)),
    st.integers(0, 63),
    st.one_of(st.just(0), st.just(0xFFFFFFFF), st.integers(0, 2**32 - 1)),
)
@example(0, 0, 0)
@example(15, 1, 0)
@example(16, 63, 0)
@example(255, 5, 1)
@example(256, 0, 0)
@example(70_000, 63, 0xFFFFFFFF)
def test_crc32_full_matches_zlib_at_any_offset(length, offset, crc):
    # Inside a larger buffer: the vector code's loads must stay within [offset, offset+length).
    expected = zlib.crc32(memoryview(CRC_POOL)[offset : offset + length], crc)
    best = lib.th_crc32_impl()
    try:
        for impl in CRC_IMPLS:
            lib.th_crc32_select(impl)
            assert crc_full(CRC_POOL, offset, length, crc) == expected, impl
    finally:
        lib.th_crc32_select(best)


@SETTINGS
@given(st.integers(0, 20_000), st.data())
def test_crc32_chains(length, data):
    # crc(a + b) == crc(b, crc(a)), and across implementations (a short a by zlib, a long b
    # by the vector code, and the reverse).
    split = data.draw(st.integers(0, length))
    offset = data.draw(st.integers(0, 63))
    whole = zlib.crc32(memoryview(CRC_POOL)[offset : offset + length])
    best = lib.th_crc32_impl()
    try:
        for first in CRC_IMPLS:
            for second in CRC_IMPLS:
                lib.th_crc32_select(first)
                a = crc_full(CRC_POOL, offset, split)
                lib.th_crc32_select(second)
                assert crc_full(CRC_POOL, offset + split, length - split, a) == whole
    finally:
        lib.th_crc32_select(best)


@pytest.mark.parametrize("length", [0, 1, 15, 16, 17, 63, 64, 65, 255, 256, 257, 1023, 1024,
                                    4096 + 15, 1 << 20])
def test_crc32_every_implementation(crc_impl, length):
    data = rand_bytes(length + 3, length)
    for impl in CRC_IMPLS:
        crc_impl(impl)
        for start in (0, 3):
            piece = data[start : start + length]
            assert crc_full(data, start, len(piece)) == zlib.crc32(piece)
            assert native.crc32(piece) == zlib.crc32(piece) & 0x7FFFFFFF


def test_crc32_forced_fallback_in_encoder_and_scanner(crc_impl):
    # The encoders and the scanner compute BODYCRC through the same switch: every path writes
    # what zlib would, and verifies what zlib wrote.
    for impl in CRC_IMPLS:
        crc_impl(impl)
        for body_len in (0, 5, 16, 100, 256, 1000, 5000):
            a = golden_args()
            a["body"] = rand_bytes(body_len, body_len + impl)
            buf = bytearray(record_size(a) + 8)
            end = encode_with(native, buf, len(buf), 0, 0, a)
            assert bytes(buf[:end]) == reference_record(a, 0)
            res = native.scanner(1).scan(native.handle_for(buf), end, 0, 0,
                                         backend.SCAN_CHECK_CRC, MAX_RECORD)
            assert (res.count, res.stop, res.infos[0].crc_ok) == (1, backend.STOP_END, 1)
            if body_len:
                buf[body_of(bytes(buf[:end])).body_pos + body_len // 2] ^= 0x40
                res = native.scanner(1).scan(native.handle_for(buf), end, 0, 0,
                                             backend.SCAN_CHECK_CRC, MAX_RECORD)
                assert res.stop == backend.STOP_BAD_CRC


# ---- single records -------------------------------------------------------------------------

GOLDEN_PROPS = rec.encode_properties({"TAGS": "TAG1", "KEYS": "1234567890123"}).encode()
HOST = rec.encode_host("127.0.0.1", 10911)


def golden_args(props=GOLDEN_PROPS) -> dict:
    return dict(topic=b"FooBar", body=GOLDEN_BODY, props=props, queue_id=0, flag=0,
                queue_offset=0, sys_flag=0, born_ts=1700000000000, born_host=HOST,
                store_ts=1700000000001, store_host=HOST, reconsume_times=0,
                prepared_offset=0)


@pytest.mark.parametrize(("trailing", "size"), [(False, 157), (True, 158)])
def test_golden_record(trailing, size):
    props = rec.encode_properties({"TAGS": "TAG1", "KEYS": "1234567890123"},
                                  trailing_separator=trailing).encode()
    a = golden_args(props)
    buf = bytearray(4096)
    assert encode_with(native, buf, len(buf), 100, 5000, a) == 100 + size
    assert bytes(buf[100 + size :]) == bytes(len(buf) - 100 - size)
    assert bytes(buf[:100]) == bytes(100)
    data = bytes(buf[100 : 100 + size])
    assert data == reference_record(a, 5100)
    msg = rec.decode_record(data, check_crc=True)
    assert msg.size == size
    assert msg.body_crc == GOLDEN_CRC
    assert msg.commitlog_offset == 5100
    assert msg.topic == "FooBar"
    assert msg.tags == "TAG1"
    assert msg.store_host == "127.0.0.1:10911"


@SETTINGS
@given(record_args(), st.integers(0, 300), int64s, st.integers(-4, 400))
def test_random_records_identical_to_python(a, pos, base_offset, slack):
    size = record_size(a)
    seg_size = max(pos + size + 8 + slack, 0)
    # Python's PHYSICALOFFSET is an unbounded int; stay where int64 does not wrap.
    assume(-(2**63) <= base_offset + pos < 2**63)
    nbuf = bytearray(seg_size + 16)
    pbuf = bytearray(seg_size + 16)
    r_native = encode_with(native, nbuf, seg_size, pos, base_offset, a)
    r_python = encode_with(py, pbuf, seg_size, pos, base_offset, a)
    assert r_native == r_python
    assert nbuf == pbuf
    if slack >= 0:
        assert r_native == pos + size
        assert bytes(nbuf[pos:r_native]) == reference_record(a, base_offset + pos)
    else:
        assert r_native == backend.ERR_NO_SPACE
        assert nbuf == bytes(len(nbuf))


@pytest.mark.parametrize("body_len", [1 << 20, 4 << 20, (4 << 20) + 12345])
@pytest.mark.parametrize("ipv6", [False, True])
def test_multi_mib_records_identical(body_len, ipv6):
    a = golden_args()
    a["body"] = rand_bytes(body_len, body_len)
    if ipv6:
        a["born_host"] = rec.encode_host("::1", 1)
        a["store_host"] = rec.encode_host("fe80::1", 10911)
    size = record_size(a)
    nbuf = bytearray(size + 8)
    pbuf = bytearray(size + 8)
    assert encode_with(native, nbuf, len(nbuf), 0, 1 << 40, a) == size
    assert encode_with(py, pbuf, len(pbuf), 0, 1 << 40, a) == size
    assert nbuf == pbuf
    sysflag = struct.unpack_from(">i", nbuf, 36)[0]
    assert sysflag & 0x30 == (0x30 if ipv6 else 0)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (dict(topic=b"t" * 128), backend.ERR_BAD_ARGUMENT),
        (dict(topic=b"t" * 127), None),
        (dict(born_host=b"\x00" * 7), backend.ERR_BAD_ARGUMENT),
        (dict(store_host=b"\x00" * 16), backend.ERR_BAD_ARGUMENT),
        (dict(born_host=b""), backend.ERR_BAD_ARGUMENT),
        (dict(props=b"p" * 32768), backend.ERR_PROPS_TOO_LARGE),
        (dict(props=b"p" * 32767), None),
        (dict(topic=b"t" * 200, props=b"p" * 40000), backend.ERR_BAD_ARGUMENT),
    ],
)
def test_record_argument_errors(change, expected):
    a = {**golden_args(), **change}
    nbuf = bytearray(65536)
    pbuf = bytearray(65536)
    r_native = encode_with(native, nbuf, len(nbuf), 0, 0, a)
    r_python = encode_with(py, pbuf, len(pbuf), 0, 0, a)
    assert r_native == r_python
    assert nbuf == pbuf
    if expected is not None:
        assert r_native == expected
        assert nbuf == bytes(len(nbuf))
    else:
        assert r_native == record_size(a)


@pytest.mark.parametrize("pos", [0, 1, 4093])
def test_no_space_boundary_is_size_plus_8(pos):
    a = golden_args()
    size = record_size(a)
    for seg_size, ok in [(pos + size + 8, True), (pos + size + 7, False), (pos + size, False),
                         (pos, False), (pos - 1 if pos else 0, False), (pos + size + 9, True)]:
        buf = bytearray(b"\xab" * (pos + size + 16))
        result = encode_with(native, buf, seg_size, pos, 0, a)
        assert result == encode_with(py, bytearray(len(buf)), seg_size, pos, 0, a)
        if ok:
            assert result == pos + size
        else:
            assert result == backend.ERR_NO_SPACE
            assert buf == b"\xab" * len(buf)


def test_pos_past_seg_size_is_no_space():
    buf = bytearray(1024)
    assert encode_with(native, buf, 500, 600, 0, golden_args()) == backend.ERR_NO_SPACE
    assert encode_with(native, buf, 500, 2**63, 0, golden_args()) == backend.ERR_NO_SPACE
    assert buf == bytes(1024)


def test_sysflag_v6_bits_follow_host_lengths():
    v6 = rec.encode_host("2001:db8::7", 4242)
    for born, store, bits in [(HOST, HOST, 0), (v6, HOST, 0x10), (HOST, v6, 0x20),
                              (v6, v6, 0x30)]:
        a = {**golden_args(), "born_host": born, "store_host": store, "sys_flag": 0x8}
        buf = bytearray(1024)
        end = encode_with(native, buf, len(buf), 0, 0, a)
        assert struct.unpack_from(">i", buf, 36)[0] == 0x8 | bits
        msg = rec.decode_record(bytes(buf[:end]), check_crc=True)
        assert msg.born_host == rec.decode_host(born)
        assert msg.store_host == rec.decode_host(store)


# ---- batches --------------------------------------------------------------------------------


def batch_wire(items) -> bytes:
    """SEND_BATCH_MESSAGE body from (flag, body, props); magic/crc as a client writes them."""
    out = []
    for flag, body, props in items:
        size = 22 + len(body) + len(props)
        out.append(struct.pack(">iiii", size, 0, 0, flag))
        out.append(struct.pack(">i", len(body)) + body + struct.pack(">H", len(props)) + props)
    return b"".join(out)


batch_props_st = st.one_of(
    st.sampled_from([b"", b"", b"CLUSTER\x01DefaultCluster", b"A\x01b\x02", b"\x02", b"x"]),
    properties(),
)
item_props_st = st.one_of(
    st.sampled_from([b"", b"TAGS\x01a", b"TAGS\x01a\x02", b"\x02", b"K\x01v\x02\x02"]),
    properties(),
)


@st.composite
def batch_args(draw) -> dict:
    items = draw(st.lists(st.tuples(int32s, bodies(4096), item_props_st), min_size=1,
                          max_size=8))
    return dict(
        items=items,
        topic=draw(text_topics),
        batch_props=draw(batch_props_st),
        queue_id=draw(int32s),
        first_queue_offset=draw(st.integers(-(2**40), 2**40)),
        sys_flag=draw(st.integers(0, 0xFF)),
        born_ts=draw(int64s),
        born_host=draw(hosts),
        store_ts=draw(int64s),
        store_host=draw(hosts),
        max_body_size=draw(st.one_of(st.just(4 << 20), st.integers(0, 4096))),
    )


def batch_args_tuple(b, wire):
    return (wire, b["topic"], b["batch_props"], b["queue_id"], b["first_queue_offset"],
            b["sys_flag"], b["born_ts"], b["born_host"], b["store_ts"], b["store_host"],
            b["max_body_size"])


def batch_with(engine, buf, seg_size, pos, base_offset, b, wire=None):
    """Through the engine API: (new pos or error, [phys offsets])."""
    wire = batch_wire(b["items"]) if wire is None else wire
    return engine.encode_batch(engine.handle_for(buf), seg_size, pos, base_offset,
                               *batch_args_tuple(b, wire))


def lib_batch(buf, seg_size, pos, base_offset, b, wire=None, out_cap=None):
    """th_encode_batch called directly: (result, [(phys, size)]), with a chosen out_cap."""
    wire = batch_wire(b["items"]) if wire is None else wire
    cap = len(b["items"]) if out_cap is None else out_cap
    out = ffi.new("th_batch_entry[]", max(cap, 1))
    count = ffi.new("size_t *", 12345)
    result = lib.th_encode_batch(
        native.handle_for(buf), seg_size, pos, base_offset, ffi.from_buffer(wire), len(wire),
        b["topic"], len(b["topic"]), b["batch_props"], len(b["batch_props"]), b["queue_id"],
        b["first_queue_offset"], b["sys_flag"], b["born_ts"], b["born_host"],
        len(b["born_host"]), b["store_ts"], b["store_host"], len(b["store_host"]),
        b["max_body_size"], out, cap, count,
    )
    if result < 0:
        assert count[0] == 0
        return result, []
    return result, [(out[i].phys_offset, out[i].size) for i in range(count[0])]


def merged_props(item_props: bytes, batch_props: bytes) -> bytes:
    if not batch_props:
        return item_props
    if item_props and not item_props.endswith(b"\x02"):
        return item_props + b"\x02" + batch_props
    return item_props + batch_props


def batch_total(b) -> int:
    return sum(
        rec.record_size(len(body), len(b["topic"]), len(merged_props(props, b["batch_props"])),
                        born_host_len=len(b["born_host"]), store_host_len=len(b["store_host"]))
        for _, body, props in b["items"]
    )


@SETTINGS
@given(batch_args(), st.integers(0, 200), st.integers(0, 2**50), st.integers(-3, 300),
       st.integers(-1, 2))
def test_random_batches_identical_to_python(b, pos, base_offset, slack, extra_cap):
    n = len(b["items"])
    seg_size = max(pos + batch_total(b) + 8 + slack, 0)
    nbuf = bytearray(b"\xcd" * (seg_size + 8))
    pbuf = bytearray(nbuf)
    ebuf = bytearray(nbuf)
    r_python = batch_with(py, pbuf, seg_size, pos, base_offset, b)
    assert batch_with(native, ebuf, seg_size, pos, base_offset, b) == r_python
    assert ebuf == pbuf
    end, entries = lib_batch(nbuf, seg_size, pos, base_offset, b, out_cap=n + extra_cap)
    if extra_cap < 0:
        assert (end, entries) == (backend.ERR_TOO_MANY, [])
        assert nbuf == b"\xcd" * len(nbuf)
        return
    assert (end, [phys for phys, _ in entries]) == r_python
    assert nbuf == pbuf
    if end < 0:
        assert nbuf == b"\xcd" * len(nbuf)
        return
    assert len(entries) == n
    # Every stored record decodes back to its item, with the merged properties (V6 bits are
    # derived from the host lengths, so a stale bit passed in cannot make it unreadable).
    p = pos
    for i, ((phys, size), (flag, body, props)) in enumerate(zip(entries, b["items"], strict=True)):
        assert phys == base_offset + p
        msg = rec.decode_record(bytes(nbuf[p : p + size]), check_crc=True, max_size=1 << 30)
        assert (msg.flag, msg.body, msg.queue_offset) == (flag, body, b["first_queue_offset"] + i)
        merged = merged_props(props, b["batch_props"])
        assert bytes(nbuf[p + size - len(merged) : p + size]) == merged
        p += size
    assert end == p


def simple_batch(n=3, **change) -> dict:
    b = dict(items=[(i, b"body-%d" % i * (i + 1), b"TAGS\x01t%d" % i) for i in range(n)],
             topic=b"BatchTopic", batch_props=b"CLUSTER\x01c", queue_id=3,
             first_queue_offset=100, sys_flag=0, born_ts=1, born_host=HOST, store_ts=2,
             store_host=HOST, max_body_size=4 << 20)
    b.update(change)
    return b


def test_batch_separator_rules():
    cases = [(b"", b"B\x01b", b"B\x01b"), (b"A\x01a", b"B\x01b", b"A\x01a\x02B\x01b"),
             (b"A\x01a\x02", b"B\x01b", b"A\x01a\x02B\x01b"), (b"A\x01a", b"", b"A\x01a"),
             (b"A\x01a\x02", b"", b"A\x01a\x02"), (b"", b"", b"")]
    for item_props, batch_props, expected in cases:
        b = simple_batch(1, items=[(7, b"x", item_props)], batch_props=batch_props)
        buf = bytearray(1024)
        end, entries = lib_batch(buf, len(buf), 0, 0, b)
        assert entries == [(0, end)]
        msg = rec.decode_record(bytes(buf[:end]), check_crc=True)
        assert buf[end - len(expected) : end] == expected
        assert struct.unpack_from(">H", buf, end - len(expected) - 2)[0] == len(expected)
        assert msg.flag == 7 and msg.queue_offset == 100


def test_batch_from_wire_encoder():
    messages = [rec.Message(topic="T", body=b"m%d" % i, tags="TagA", keys=("k1", "k2"), flag=i)
                for i in range(5)]
    for trailing in (False, True):
        wire = rec.encode_batch(messages, trailing_separator=trailing)
        b = simple_batch(5)
        nbuf, pbuf = bytearray(4096), bytearray(4096)
        end, entries = lib_batch(nbuf, 4096, 10, 1000, b, wire=wire)
        assert (end, [phys for phys, _ in entries]) == batch_with(py, pbuf, 4096, 10, 1000, b,
                                                                  wire=wire)
        assert nbuf == pbuf
        assert [phys for phys, _ in entries] == [
            1010 + sum(size for _, size in entries[:i]) for i in range(5)]
        assert end == 10 + sum(size for _, size in entries)


def test_batch_no_space_is_all_or_nothing():
    b = simple_batch(4)
    total = batch_total(b)
    for seg_size, ok in [(50 + total + 8, True), (50 + total + 7, False), (50 + total, False)]:
        buf = bytearray(b"\xee" * (50 + total + 64))
        end, entries = lib_batch(buf, seg_size, 50, 0, b)
        if ok:
            assert end == 50 + total and len(entries) == 4
        else:
            assert (end, entries) == (backend.ERR_NO_SPACE, [])
            assert buf == b"\xee" * len(buf)


def corrupt_items(kind: str) -> bytes:
    """A 3-item batch body with item 1 (the middle one) or the end broken."""
    good = [(1, b"aaaa", b"TAGS\x01x"), (2, b"bbbbbb", b"K\x01v"), (3, b"cc", b"")]
    wire = bytearray(batch_wire(good))
    second = 22 + 4 + 6
    if kind == "size+1":
        struct.pack_into(">i", wire, second, struct.unpack_from(">i", wire, second)[0] + 1)
    elif kind == "size-1":
        struct.pack_into(">i", wire, second, struct.unpack_from(">i", wire, second)[0] - 1)
    elif kind == "size0":
        struct.pack_into(">i", wire, second, 0)
    elif kind == "body_len_negative":
        struct.pack_into(">i", wire, second + 16, -1)
    elif kind == "body_len_huge":
        struct.pack_into(">i", wire, second + 16, 2**31 - 1)
    elif kind == "props_len_huge":
        struct.pack_into(">H", wire, second + 20 + 6, 0xFFFF)
    elif kind == "truncated_last":
        del wire[-1]
    elif kind == "short_tail":
        wire += b"\x00" * 21
    elif kind == "trailing_byte":
        wire += b"\x00"
    return bytes(wire)


@pytest.mark.parametrize("kind", ["size+1", "size-1", "size0", "body_len_negative",
                                  "body_len_huge", "props_len_huge", "truncated_last",
                                  "short_tail", "trailing_byte"])
def test_batch_malformed_item_writes_nothing(kind):
    b = simple_batch(3)
    wire = corrupt_items(kind)
    for call in (lambda buf: lib_batch(buf, len(buf), 0, 0, b, wire=wire),
                 lambda buf: batch_with(native, buf, len(buf), 0, 0, b, wire=wire),
                 lambda buf: batch_with(py, buf, len(buf), 0, 0, b, wire=wire)):
        buf = bytearray(b"\x11" * 8192)
        assert call(buf) == (backend.ERR_BATCH_FORMAT, [])
        assert buf == b"\x11" * len(buf)


def test_batch_errors():
    buf = bytearray(b"\x22" * 65536)
    # No items at all is a malformed batch (a producer never sends an empty one).
    assert lib_batch(buf, len(buf), 0, 0, simple_batch(0), wire=b"") == (
        backend.ERR_BATCH_FORMAT, [])
    assert batch_with(native, buf, len(buf), 0, 0, simple_batch(0), wire=b"") == (
        backend.ERR_BATCH_FORMAT, [])
    assert batch_with(py, bytearray(64), 64, 0, 0, simple_batch(0), wire=b"") == (
        backend.ERR_BATCH_FORMAT, [])
    # More items than out_cap, however many more.
    for cap in (0, 1, 2, 3):
        assert lib_batch(buf, len(buf), 0, 0, simple_batch(4), out_cap=cap) == (
            backend.ERR_TOO_MANY, [])
    # A body over max_body_size in the last item.
    b = simple_batch(3, max_body_size=len(b"body-1") * 2)
    assert lib_batch(buf, len(buf), 0, 0, b) == (backend.ERR_BODY_TOO_LARGE, [])
    assert batch_with(py, bytearray(65536), 65536, 0, 0, b) == (backend.ERR_BODY_TOO_LARGE, [])
    # Merged properties over 32767 although each part alone fits.
    b = simple_batch(2, items=[(0, b"x", b"A\x01" + b"a" * 16000), (0, b"y", b"")],
                     batch_props=b"B\x01" + b"b" * 16763)
    assert len(merged_props(b["items"][0][2], b["batch_props"])) == 32768
    assert lib_batch(buf, len(buf), 0, 0, b) == (backend.ERR_PROPS_TOO_LARGE, [])
    assert batch_with(py, bytearray(65536), 65536, 0, 0, b) == (
        backend.ERR_PROPS_TOO_LARGE, [])
    b["batch_props"] = b["batch_props"][:-1]
    assert lib_batch(bytearray(65536), 65536, 0, 0, b)[0] > 0
    # Bad shared arguments.
    for change in (dict(topic=b"t" * 128), dict(born_host=b"1234"), dict(store_host=b"x" * 19)):
        assert lib_batch(buf, len(buf), 0, 0, simple_batch(2, **change)) == (
            backend.ERR_BAD_ARGUMENT, [])
    assert buf == b"\x22" * len(buf)


# ---- scanning -------------------------------------------------------------------------------


@st.composite
def stored_records(draw) -> bytes:
    """One record as the store (or a 5.x store, v2) wrote it, at a placeholder offset."""
    version = draw(st.sampled_from([1, 1, 1, 2]))
    a = draw(record_args(max_body=1500))
    a["sys_flag"] &= ~0x30  # encode_record sets the V6 bits from the hosts
    if version == 2:
        a["topic"] = draw(st.one_of(st.just(a["topic"]), st.binary(min_size=128, max_size=300)))
    return reference_record(a, draw(int64s), version=version)


def assert_same_scan(n_res, p_res):
    assert (n_res.count, n_res.end, n_res.stop, n_res.size) == (
        p_res.count, p_res.end, p_res.stop, p_res.size)
    assert p_res.count == len(p_res.infos)
    for i in range(p_res.count):
        for field in FIELDS:
            assert getattr(n_res.infos[i], field) == getattr(p_res.infos[i], field), (i, field)


def scan_both(buf, limit, pos, base_offset, flags, max_record, capacity=64):
    n_res = native.scanner(capacity).scan(native.handle_for(buf), limit, pos, base_offset,
                                          flags, max_record)
    p_res = py.scanner(capacity).scan(py.handle_for(buf), limit, pos, base_offset, flags,
                                      max_record)
    assert_same_scan(n_res, p_res)
    return n_res, p_res


def body_of(record: bytes):
    """The Python scanner's description of a single well-formed record."""
    res = py.scanner(1).scan(memoryview(record), len(record), 0, 0, 0, 1 << 30)
    assert res.count == 1
    return res.infos[0]


TAILS = ["none", "blank", "partial", "zeros", "flip_body", "totalsize", "any_byte", "sysflag"]


@st.composite
def scan_cases(draw):
    records = draw(st.lists(stored_records(), max_size=6))
    prefix = draw(st.binary(max_size=12))
    buf = bytearray(prefix + b"".join(records))
    starts = []
    p = len(prefix)
    for r in records:
        starts.append(p)
        p += len(r)
    tail = draw(st.sampled_from(TAILS))
    if tail == "blank":
        buf += rec.encode_blank(draw(st.integers(8, 1 << 20))) + bytes(draw(st.integers(0, 20)))
    elif tail == "partial":
        extra = draw(stored_records())
        buf += extra[: draw(st.integers(0, len(extra) - 1))]
    elif tail == "zeros":
        buf += bytes(draw(st.integers(1, 200)))
    elif records and tail in ("flip_body", "totalsize", "any_byte", "sysflag"):
        k = draw(st.integers(0, len(records) - 1))
        at, size = starts[k], len(records[k])
        if tail == "flip_body":
            info = body_of(records[k])
            if info.body_len:
                at_body = at + info.body_pos + draw(st.integers(0, info.body_len - 1))
                buf[at_body] ^= 1 << draw(st.integers(0, 7))
        elif tail == "totalsize":
            value = draw(st.sampled_from([0, 1, 8, 90, 91, 92, size - 1, size + 1, size + 1000,
                                          2**31 - 1, -1, -size, MAX_RECORD + 1]))
            struct.pack_into(">i", buf, at, value)
        elif tail == "sysflag":
            buf[at + 39] ^= draw(st.sampled_from([0x10, 0x20, 0x30]))
        else:
            buf[at + draw(st.integers(0, size - 1))] = draw(st.integers(0, 255))
    limit = draw(st.one_of(st.just(len(buf)), st.integers(0, len(buf))))
    pos = draw(st.one_of(st.just(len(prefix)), st.sampled_from(starts or [len(prefix)]),
                         st.integers(0, len(buf) + 2)))
    flags = draw(st.integers(0, 3))
    max_record = draw(st.one_of(st.just(MAX_RECORD), st.integers(0, 2000)))
    return buf, limit, pos, flags, max_record


@settings(SETTINGS, max_examples=150)
@given(scan_cases(), int64s.filter(lambda b: -(2**62) < b < 2**62))
def test_scan_matches_python(case, base_offset):
    buf, limit, pos, flags, max_record = case
    scan_both(bytes(buf), limit, pos, base_offset, flags, max_record)


@SETTINGS
@given(st.binary(max_size=600), st.integers(0, 3))
def test_scan_random_bytes_matches_python(data, flags):
    # Raw noise, and noise behind a plausible header so _parse's length checks get exercised.
    for buf in (data, struct.pack(">iI", len(data) + 8, rec.MAGIC_V1) + data,
                struct.pack(">iI", len(data) + 8, rec.MAGIC_V2) + data):
        scan_both(buf, len(buf), 0, 0, flags, MAX_RECORD)


def build_segment(count: int, seed: int) -> tuple[bytearray, list[int]]:
    rnd = random.Random(seed)
    buf = bytearray()
    starts = []
    for i in range(count):
        props = rec.encode_properties({"TAGS": f"tag-{i % 7}", "KEYS": f"k{i}"}).encode()
        starts.append(len(buf))
        buf += rec.encode_record(
            topic=b"ScanTopic", body=rnd.randbytes(rnd.randrange(0, 300)), properties=props,
            queue_id=i % 4, flag=i, queue_offset=i, commitlog_offset=len(buf), sys_flag=0,
            born_timestamp=i, born_host=HOST, store_timestamp=i + 1,
            store_host=rec.encode_host("::1", 9) if i % 3 == 0 else HOST,
        )
    return buf, starts


def test_scan_partial_record_at_every_cut():
    buf, starts = build_segment(4, 1)
    last = starts[-1]
    for cut in range(last, len(buf)):
        for flags in (0, 3):
            n_res, _ = scan_both(bytes(buf[:cut]), cut, 0, 0, flags, MAX_RECORD)
            assert n_res.count == 3
            assert n_res.end == last
            assert n_res.stop == (backend.STOP_END if cut == last else backend.STOP_PARTIAL)
        # Same cut but with the bytes after `limit` present: the scanner must not look there.
        n_res, _ = scan_both(bytes(buf), cut, 0, 0, 3, MAX_RECORD)
        assert n_res.end == last


def test_scan_bad_crc_stops_only_with_check():
    buf, starts = build_segment(5, 2)
    msg = rec.decode_record(bytes(buf), starts[2])
    assert msg.body
    body_at = starts[2] + body_of(bytes(buf[starts[2] : starts[2] + msg.size])).body_pos
    assert bytes(buf[body_at : body_at + len(msg.body)]) == msg.body
    buf[body_at] ^= 0xFF
    n_res, _ = scan_both(bytes(buf), len(buf), 0, 0, backend.SCAN_CHECK_CRC, MAX_RECORD)
    assert (n_res.count, n_res.end, n_res.stop, n_res.size) == (
        2, starts[2], backend.STOP_BAD_CRC, msg.size)
    # The mismatching record is described (not counted) right after the counted ones.
    assert n_res.infos[2].crc_ok == 0
    assert n_res.infos[2].phys_offset == starts[2]
    n_res, _ = scan_both(bytes(buf), len(buf), 0, 0, 0, MAX_RECORD)
    assert (n_res.count, n_res.stop) == (5, backend.STOP_END)
    assert all(n_res.infos[i].crc_ok == 2 for i in range(5))


def test_scan_tags_and_fields():
    buf, starts = build_segment(9, 3)
    buf += rec.encode_blank(1000)
    n_res, _ = scan_both(bytes(buf), len(buf), 0, 7 << 30, 3, MAX_RECORD)
    assert (n_res.count, n_res.stop, n_res.size) == (9, backend.STOP_BLANK, 1000)
    for i in range(9):
        info = n_res.infos[i]
        assert info.phys_offset == (7 << 30) + starts[i]
        assert info.tags_code == rec.java_string_hash(f"tag-{i % 7}")
        assert info.crc_ok == 1
        assert info.store_host_len == (20 if i % 3 == 0 else 8)
        assert buf[info.topic_pos : info.topic_pos + info.topic_len] == b"ScanTopic"
    n_res, _ = scan_both(bytes(buf), len(buf), 0, 0, backend.SCAN_CHECK_CRC, MAX_RECORD)
    assert all(n_res.infos[i].tags_code == 0 for i in range(9))


@pytest.mark.parametrize(
    ("props", "tags"),
    [(b"TAGS\x01a\x02TAGS\x01b", "b"), (b"TAGS\x01a\x02TAGS\x01", "a"),
     (b"TAGS\x01\x01x", "\x01x"), (b"TAGS\x01", None), (b"TAGSx\x01a", None),
     (b"\x02\x02TAGS\x01t\xff\x02", "t\ufffd"), (b"KEYS\x01k", None), (b"", None),
     (b"TAGS\x01\xe2\x82\x02", "\ufffd")],
)
def test_scan_tags_edge_cases(props, tags):
    a = {**golden_args(), "props": props}
    buf = bytearray(1024)
    end = encode_with(native, buf, len(buf), 0, 0, a)
    n_res, _ = scan_both(bytes(buf), end, 0, 0, backend.SCAN_TAGS, MAX_RECORD)
    assert n_res.infos[0].tags_code == (rec.java_string_hash(tags) if tags else 0)


@pytest.mark.parametrize("capacity", [1, 2, 3, 7])
def test_scan_full_and_resume(capacity):
    buf, starts = build_segment(20, 4)
    buf += rec.encode_blank(64)
    handle = native.handle_for(buf)
    scanner = native.scanner(capacity)
    reference = py.scanner(100).scan(py.handle_for(buf), len(buf), 0, 5, 3, MAX_RECORD)
    assert (reference.count, reference.stop) == (20, backend.STOP_BLANK)
    got = []
    pos = 0
    while True:
        res = scanner.scan(handle, len(buf), pos, 5, 3, MAX_RECORD)
        got += [{f: getattr(res.infos[i], f) for f in FIELDS} for i in range(res.count)]
        if res.stop != backend.STOP_FULL:
            break
        assert res.count == capacity and res.size == 0
        assert res.end == (starts + [len(buf) - 8])[len(got)]
        pos = res.end
    assert (res.stop, res.end, res.size) == (reference.stop, reference.end, reference.size)
    assert got == [{f: getattr(info, f) for f in FIELDS} for info in reference.infos]
    # Capacity 0: nothing to describe, but reaching `limit` still says END.
    empty = native.scanner(0).scan(handle, len(buf), 0, 0, 0, MAX_RECORD)
    assert (empty.count, empty.stop, empty.end) == (0, backend.STOP_FULL, 0)
    at_end = native.scanner(0).scan(handle, 10, 10, 0, 0, MAX_RECORD)
    assert (at_end.count, at_end.stop) == (0, backend.STOP_END)


# ---- consume-queue runs ---------------------------------------------------------------------

CQ_TOPICS = [b"TopicA", b"TopicB", b"TopicA2", b"", b"t" * 127, "主题".encode()]
CQ_SYSFLAGS = [0, 0, 0, rec.TRANSACTION_COMMIT, rec.TRANSACTION_PREPARED,
               rec.TRANSACTION_ROLLBACK, 0x1, 0x2, 0x3 | rec.TRANSACTION_COMMIT,
               0x1 | rec.TRANSACTION_PREPARED, 0x2 | rec.TRANSACTION_ROLLBACK, 0x40, 0x100]
INT64_MAX = 2**63 - 1


def cq_record(buf: bytearray, base_offset: int, topic: bytes, queue_id: int, queue_offset: int,
              sys_flag: int = 0, tags: str | None = None, body: bytes = b"m") -> None:
    props = rec.encode_properties({"TAGS": tags} if tags else {}).encode()
    buf += rec.encode_record(
        topic=topic, body=body, properties=props, queue_id=queue_id, flag=0,
        queue_offset=queue_offset, commitlog_offset=base_offset + len(buf), sys_flag=sys_flag,
        born_timestamp=1, born_host=HOST, store_timestamp=2, store_host=HOST,
    )


@st.composite
def cq_segments(draw) -> tuple[bytearray, int, int]:
    """Records as a store writes them: mostly runs of consecutive offsets to one queue,
    interleaved with other queues and topics, gaps, repeats and transactional records."""
    base_offset = draw(st.integers(0, 2**40))
    buf = bytearray(draw(st.binary(max_size=5)))
    start = len(buf)
    next_offset: dict[tuple[bytes, int], int] = {}
    key = (CQ_TOPICS[0], 0)
    for _ in range(draw(st.integers(0, 80))):
        if draw(st.integers(0, 3)) == 0:  # switch queue (or stay, by chance)
            key = (draw(st.sampled_from(CQ_TOPICS)),
                   draw(st.sampled_from([0, 1, 2, 7, -1, 2**31 - 1])))
        kind = draw(st.sampled_from(["next"] * 6 + ["same", "gap", "any"]))
        following = next_offset.get(key, 0)
        if kind == "next":
            queue_offset = following
        elif kind == "same":
            queue_offset = following - 1
        elif kind == "gap":
            queue_offset = following + draw(st.sampled_from([-5, -2, 2, 3, 1000]))
        else:
            queue_offset = draw(st.one_of(int64s, st.sampled_from([INT64_MAX - 1, INT64_MAX,
                                                                   -(2**63)])))
        queue_offset = max(-(2**63), min(INT64_MAX, queue_offset))
        # Past INT64_MAX the "next" offset wraps to INT64_MIN: a new run, in C as in Python.
        next_offset[key] = queue_offset + 1 if queue_offset < INT64_MAX else -(2**63)
        tags = draw(st.sampled_from([None, "TagA", "tag-\U0001f600"]))
        cq_record(buf, base_offset, key[0], key[1], queue_offset,
                  draw(st.sampled_from(CQ_SYSFLAGS)), tags, b"x" * draw(st.integers(0, 40)))
    return buf, base_offset, start


def indexed(infos, count):
    return [i for i in range(count) if (infos[i].sys_flag & 0xC) not in (0x4, 0xC)]


def assert_same_runs(buf, handle, res):
    """Both engines group ``res`` alike, and the grouping keeps its promises: every indexed
    record in one run; a run's records of one queue, in scan order, with consecutive queue
    offsets; its entries together, in order, each its record's."""
    runs, entries, order = native.cq_runs(handle, res)
    want_runs, want_entries, want_order = py.cq_runs(py.handle_for(buf), res)
    assert runs == want_runs
    assert bytes(entries) == bytes(want_entries)
    assert list(order) == list(want_order)
    infos = res.infos
    assert sorted(order) == indexed(infos, res.count)
    assert [first for first, *_ in runs] == sorted(first for first, *_ in runs)
    at = 0
    for first, count, last, entry in runs:
        assert entry == at
        members = list(order[entry : entry + count])
        assert members[0] == first and members[-1] == last and members == sorted(members)
        for earlier, later in zip(members, members[1:], strict=False):
            a, b = infos[earlier], infos[later]
            assert (a.queue_id, topic_of(buf, a)) == (b.queue_id, topic_of(buf, b))
            assert b.queue_offset == a.queue_offset + 1
        for j, i in enumerate(members, entry):
            info = infos[i]
            assert entries[20 * j : 20 * j + 20] == struct.pack(
                ">qiq", info.phys_offset, info.size, info.tags_code)
        at += count
    assert len(entries) == 20 * at
    return runs, entries, order


def topic_of(buf, info) -> bytes:
    return bytes(buf[info.topic_pos : info.topic_pos + info.topic_len])


@settings(SETTINGS, max_examples=150)
@given(cq_segments(), st.sampled_from([1, 3, 16, 4096]))
def test_cq_runs_match_python(segment, capacity):
    buf, base_offset, start = segment
    handle = native.handle_for(buf)
    scanner = native.scanner(capacity)
    p_scanner = py.scanner(capacity)
    pos = start
    while True:
        res = scanner.scan(handle, len(buf), pos, base_offset, backend.SCAN_TAGS, MAX_RECORD)
        runs, entries, order = assert_same_runs(buf, handle, res)
        # ... and the Python engine, from its own scan, says the same.
        p_res = p_scanner.scan(py.handle_for(buf), len(buf), pos, base_offset,
                               backend.SCAN_TAGS, MAX_RECORD)
        p_runs, p_entries, p_order = py.cq_runs(py.handle_for(buf), p_res)
        assert (p_runs, bytes(p_entries), list(p_order)) == (runs, bytes(entries), list(order))
        assert res.stop in (backend.STOP_END, backend.STOP_FULL)
        if res.stop == backend.STOP_END:
            break
        pos = res.end


def test_cq_runs_known_sequence():
    P, C, R = rec.TRANSACTION_PREPARED, rec.TRANSACTION_COMMIT, rec.TRANSACTION_ROLLBACK
    records = [
        (b"A", 0, 5, 0), (b"A", 0, 6, 0), (b"A", 0, 7, P), (b"A", 0, 8, 0), (b"A", 0, 9, C),
        (b"B", 0, 10, 0), (b"B", 1, 11, 0), (b"B", 1, 12, R), (b"B", 1, 13, 0),
        (b"A", 0, 10, 0), (b"A", 0, 12, 0), (b"A", 0, 12, 0), (b"AB", 0, 13, 0),
        (b"Z", 3, INT64_MAX, 0), (b"Z", 3, -(2**63), 0), (b"Z", 3, -(2**63) + 1, 0),
        (b"Z", 4, -(2**63) + 2, 0), (b"Z", 4, -(2**63) + 3, 0),
    ]
    buf = bytearray()
    for i, (topic, queue_id, queue_offset, sys_flag) in enumerate(records):
        cq_record(buf, 1000, topic, queue_id, queue_offset, sys_flag, tags=f"t{i % 3}")
    handle = native.handle_for(buf)
    res = native.scanner(64).scan(handle, len(buf), 0, 1000, backend.SCAN_TAGS, MAX_RECORD)
    assert res.count == len(records)
    runs, entries, order = assert_same_runs(buf, handle, res)
    # (first, count, last, entry). A/0 at 10 (record 9) continues the run of 8 and 9 across
    # the B records between; INT64_MAX is never followed; a repeat starts a run.
    assert runs == [(0, 2, 1, 0), (3, 3, 9, 2), (5, 1, 5, 5), (6, 1, 6, 6), (8, 1, 8, 7),
                    (10, 1, 10, 8), (11, 1, 11, 9), (12, 1, 12, 10), (13, 1, 13, 11),
                    (14, 2, 15, 12), (16, 2, 17, 14)]
    assert list(order) == [0, 1, 3, 4, 9, 5, 6, 8, 10, 11, 12, 13, 14, 15, 16, 17]
    info = res.infos[4]
    assert entries[60:80] == struct.pack(">qiq", info.phys_offset, info.size, info.tags_code)
    assert info.tags_code == rec.java_string_hash("t1") != 0


def test_cq_runs_of_producers_taking_turns_over_queues_are_one_per_queue():
    """Single sends spread over queues arrive interleaved: a run per queue, not per record
    (the dispatcher then writes each queue once per scan)."""
    buf = bytearray()
    for i in range(40):
        cq_record(buf, 0, b"T", i % 4, 100 + i // 4)
    handle = native.handle_for(buf)
    res = native.scanner(64).scan(handle, len(buf), 0, 0, 0, MAX_RECORD)
    runs, _, order = assert_same_runs(buf, handle, res)
    assert runs == [(q, 10, 36 + q, 10 * q) for q in range(4)]
    assert list(order[10:20]) == list(range(1, 40, 4))


def test_cq_runs_capacity_and_empty():
    buf = bytearray()
    for i in range(10):
        cq_record(buf, 0, b"T", i, 0)  # ten queues: ten runs of one
    handle = native.handle_for(buf)
    res = native.scanner(16).scan(handle, len(buf), 0, 0, 0, MAX_RECORD)
    full, _, _ = assert_same_runs(buf, handle, res)
    assert len(full) == 10
    entries = ffi.new("uint8_t[]", 200)
    order = ffi.new("uint32_t[]", 10)
    table = ffi.new("uint32_t[]", 32)
    for cap in range(11):
        out = ffi.new("th_cq_run[]", max(cap, 1))
        n = lib.th_cq_runs(handle, res.infos, res.count, entries, order, out, cap, table, 32)
        assert n == cap
        assert [(out[i].first, out[i].count, out[i].last, out[i].entry)
                for i in range(n)] == full[:cap]
        assert list(order[0:cap]) == list(range(cap))
    assert lib.th_cq_runs(handle, res.infos, 0, ffi.NULL, ffi.NULL, ffi.NULL, 0, ffi.NULL, 0) == 0
    # The scratch table must be a power of two of at least twice the records.
    out = ffi.new("th_cq_run[]", 10)
    for size in (16, 24, 31):
        assert lib.th_cq_runs(handle, res.infos, res.count, entries, order, out, 10,
                              table, size) == 2**64 - 1
    # An empty scan (a fresh engine has no arrays yet) and one after it that needs more room.
    assert backend.native_module is not None
    engine = backend.NativeEngine(backend.native_module)
    empty = native.scanner(4).scan(handle, 0, 0, 0, 0, MAX_RECORD)
    assert engine.cq_runs(handle, empty) == ([], b"", ())
    small = native.scanner(3).scan(handle, len(buf), 0, 0, 0, MAX_RECORD)
    assert engine.cq_runs(handle, small).runs == full[:3]
    assert engine.cq_runs(handle, res).runs == full
    # Only the PREPARED/ROLLBACK records: no runs at all.
    buf = bytearray()
    for i in range(4):
        cq_record(buf, 0, b"T", 0, i, rec.TRANSACTION_PREPARED if i % 2 else
                  rec.TRANSACTION_ROLLBACK)
    handle = native.handle_for(buf)
    res = native.scanner(8).scan(handle, len(buf), 0, 0, 0, MAX_RECORD)
    assert assert_same_runs(buf, handle, res)[0] == []


# ---- guard pages: nothing is read at/after `limit`, nothing written past seg_size ------------

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


class GuardedBuffer:
    """`pages` usable pages followed by one PROT_NONE page: any access past them faults."""

    def __init__(self, pages: int) -> None:
        self.size = pages * PAGE
        self.mm = mmap.mmap(-1, self.size + PAGE)
        anchor = ctypes.c_char.from_buffer(self.mm)
        self.addr = ctypes.addressof(anchor)
        del anchor
        if _libc.mprotect(self.addr + self.size, PAGE, 0) != 0:
            raise OSError(ctypes.get_errno(), "mprotect")

    def close(self) -> None:
        _libc.mprotect(self.addr + self.size, PAGE, mmap.PROT_READ | mmap.PROT_WRITE)
        self.mm.close()


@pytest.fixture
def guarded():
    made = []

    def make(pages: int) -> GuardedBuffer:
        g = GuardedBuffer(pages)
        made.append(g)
        return g

    yield make
    for g in made:
        g.close()


def test_scan_never_reads_past_limit(guarded):
    seg, starts = build_segment(12, 5)
    g = guarded(2)
    assert len(seg) < g.size
    handle = native.handle_for(g.mm)
    for cut in [*range(starts[-1], len(seg)), *range(len(seg) - 12, len(seg))]:
        piece = seg[:cut]
        at = g.size - len(piece)  # the data ends exactly at the guard page
        g.mm[at : g.size] = piece
        res = native.scanner(64).scan(handle, g.size, at, 0, 3, MAX_RECORD)
        assert res.stop in (backend.STOP_END, backend.STOP_PARTIAL)
        assert res.end in [at + s for s in starts] + [g.size]


def test_encoders_never_write_past_seg_size(guarded):
    g = guarded(1)
    handle = native.handle_for(g.mm)
    a = golden_args()
    size = record_size(a)
    pos = g.size - size - 8
    assert native.encode_record(handle, g.size, pos + 1, 0, a["topic"], a["body"], a["props"],
                                0, 0, 0, 0, 0, HOST, 0, HOST, 0, 0) == backend.ERR_NO_SPACE
    assert native.encode_record(handle, g.size, pos, 0, a["topic"], a["body"], a["props"],
                                0, 0, 0, 0, 0, HOST, 0, HOST, 0, 0) == g.size - 8
    b = simple_batch(5)
    total = batch_total(b)
    assert lib_batch(g.mm, g.size, g.size - total - 7, 0, b)[0] == backend.ERR_NO_SPACE
    assert lib_batch(g.mm, g.size, g.size - total - 8, 0, b)[0] == g.size - 8


def test_crc32_reads_only_its_bytes(guarded):
    # Data against a PROT_NONE page on either side: a load past the end or before the start
    # of the range (the vector code's 16/64-byte loads, its tail re-read) would fault.
    g = guarded(3)
    data = rand_bytes(2 * PAGE, 13)
    g.mm[PAGE : 3 * PAGE] = data
    assert _libc.mprotect(g.addr, PAGE, 0) == 0  # guard before the data, too
    try:
        handle = native.handle_for(g.mm)
        best = lib.th_crc32_impl()
        try:
            for impl in CRC_IMPLS:
                lib.th_crc32_select(impl)
                for n in [*range(600), 1023, 1024, 1025, 2047, 4095, 2 * PAGE]:
                    end = g.size - n  # ending at the guard page
                    assert lib.th_crc32_full(0, handle + end, n) == zlib.crc32(data[len(data) - n :])
                    assert lib.th_crc32_full(0, handle + PAGE, n) == zlib.crc32(data[:n])
        finally:
            lib.th_crc32_select(best)
        del handle
    finally:
        _libc.mprotect(g.addr, PAGE, mmap.PROT_READ | mmap.PROT_WRITE)


# ---- memory and files -----------------------------------------------------------------------


def test_file_helpers_on_a_real_mapping(tmp_path):
    path = tmp_path / "segment"
    size = 1 << 20
    with open(path, "w+b") as f:
        fd = f.fileno()
        native.fallocate(fd, 0, size)
        assert lib.th_fallocate(fd, 0, size) == 0
        assert os.fstat(fd).st_size == size
        assert os.fstat(fd).st_blocks * 512 >= size
        with mmap.mmap(fd, size) as mm:
            handle = native.handle_for(mm)
            native.warm(handle, 0, size)
            native.warm(handle, 12345, 3 * PAGE + 7)
            assert mm[:] == bytes(size)
            # Records appended into the warmed mapping reach the file after msync.
            end = encode_with(native, mm, size, 0, 0, golden_args())
            native.msync(handle, 3, end)
            native.msync(handle, PAGE + 100, 10)
            assert os.pread(fd, end, 0) == mm[:end]
            rec.decode_record(os.pread(fd, end, 0), check_crc=True)
            # Zero a "dirty tail".
            mm[5000:9000] = b"\xff" * 4000
            native.zero(handle, 5000, 4000)
            assert mm[4999:9001] == bytes(4002)
            native.zero(handle, 0, 0)
            # Warm never changes the contents, inside its range or outside it.
            mm[:] = b"\x5a" * size
            native.warm(handle, 100, 2 * PAGE)
            assert mm[:] == b"\x5a" * size
            del handle
    assert lib.th_fallocate(-1, 0, 10) == errno.EBADF


_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
MADV_POPULATE_WRITE = 23


def kernel_has_populate_write() -> bool:
    with mmap.mmap(-1, PAGE) as mm:
        anchor = ctypes.c_char.from_buffer(mm)
        rc = _libc.madvise(ctypes.addressof(anchor), PAGE, MADV_POPULATE_WRITE)
        del anchor
    return rc == 0


@pytest.fixture(params=["populate", "touch"])
def warm_mode(request):
    """th_warm as it runs (MADV_POPULATE_WRITE where the kernel has it), and its fallback."""
    lib.th_warm_force_touch(request.param == "touch")
    yield request.param
    lib.th_warm_force_touch(0)


def resident_pages(mm, start: int, length: int) -> int:
    """How many pages of mm[start:start+length] are resident (mincore)."""
    anchor = ctypes.c_char.from_buffer(mm)
    base = ctypes.addressof(anchor)
    first = (base + start) & ~(PAGE - 1)
    count = (base + start + length - first + PAGE - 1) // PAGE
    vec = (ctypes.c_ubyte * count)()
    rc = _libc.mincore(first, count * PAGE, vec)
    del anchor
    assert rc == 0, ctypes.get_errno()
    return sum(v & 1 for v in vec)


@pytest.mark.parametrize(("start", "length"), [(0, 64 * PAGE), (1, 64 * PAGE - 1), (PAGE - 1, 2),
                                           (12345, 20 * PAGE + 7), (5 * PAGE, 1), (0, 1)])
def test_warm_fresh_file_mapping(tmp_path, warm_mode, start, length):
    # A fresh (fallocated, all-zero) segment file: after warm every page the range overlaps
    # is in memory, the file still reads as zeros, and the range takes writes.
    size = 128 * PAGE
    path = tmp_path / "segment"
    with open(path, "w+b") as f:
        fd = f.fileno()
        native.fallocate(fd, 0, size)
        with mmap.mmap(fd, size) as mm:
            handle = native.handle_for(mm)
            assert lib.th_warm(handle + start, length) == 0
            first, last = start // PAGE, (start + length - 1) // PAGE
            assert resident_pages(mm, start, length) == last - first + 1
            assert mm[:] == bytes(size)
            assert os.pread(fd, size, 0) == bytes(size)
            mm[start : start + length] = b"\x01" * length  # writable, no error
            assert os.pread(fd, length, start) == b"\x01" * length
            del handle
    assert lib.th_warm(ffi.NULL, 0) == 0


def test_warm_keeps_existing_contents(tmp_path, warm_mode):
    size = 16 * PAGE
    path = tmp_path / "segment"
    data = rand_bytes(size, 3)
    path.write_bytes(data)
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), size) as mm:
        handle = native.handle_for(mm)
        assert lib.th_warm(handle + 7, size - 7) == 0
        assert lib.th_warm(handle, size) == 0
        assert mm[:] == data
        del handle
    assert path.read_bytes() == data


def test_warm_reports_pages_past_end_of_file(tmp_path):
    # A store there would be SIGBUS; MADV_POPULATE_WRITE reports it, th_warm returns -EFAULT.
    if not kernel_has_populate_write():
        pytest.skip("kernel without MADV_POPULATE_WRITE: the fallback would take SIGBUS")
    path = tmp_path / "segment"
    with open(path, "w+b") as f:
        f.truncate(4 * PAGE)
        with mmap.mmap(f.fileno(), 4 * PAGE) as mm:
            os.ftruncate(f.fileno(), PAGE)
            handle = native.handle_for(mm)
            assert lib.th_warm(handle, PAGE) == 0
            assert lib.th_warm(handle, 4 * PAGE) == -errno.EFAULT
            try:
                native.warm(handle, PAGE, PAGE)
            except OSError as exc:
                code = exc.errno
            else:
                code = None
            del handle
            assert code == errno.EFAULT


def test_msync_reports_errors():
    # Page 0 is never mapped: msync fails with ENOMEM, reported as -errno.
    assert lib.th_msync(ffi.cast("uint8_t *", 16), 10) == -errno.ENOMEM


@contextlib.contextmanager
def tcp_pair():
    """A connected loopback TCP pair (splice reads TCP sockets; a socketpair is AF_UNIX)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        sender = socket.create_connection(server.getsockname())
        receiver, _ = server.accept()
    with sender, receiver:
        yield sender, receiver


def pipe_is_empty(pipe: tuple[int, int]) -> bool:
    try:
        os.read(pipe[0], 1)
    except BlockingIOError:
        return True
    return False


def splice_all(splice, sender, receiver, pipe, fd: int, at: int, data: bytes, *,
               first_count: int | None = None) -> None:
    """Send ``data`` from a thread and splice it into ``fd`` at ``at`` until all of it is
    there: every call moves at most what it was asked (``first_count`` for the first) and
    leaves the pipe empty; a socket silent for 5 s fails the test."""
    receiver.setblocking(False)
    sending = threading.Thread(target=sender.sendall, args=(data,), daemon=True)
    sending.start()
    got = 0
    while got < len(data):
        count = first_count if got == 0 and first_count else len(data) - got
        n = splice(receiver.fileno(), pipe, fd, at + got, count)
        if n == -errno.EAGAIN:
            assert select.select([receiver], [], [], 5)[0], f"no bytes for 5 s after {got}"
            continue
        assert 0 < n <= count
        assert pipe_is_empty(pipe)
        got += n
    sending.join(5)


@pytest.mark.parametrize("engine_name", ["native", "python"])
def test_splice_to_file(tmp_path, engine_name):
    """th_splice_to_file, and both engines' splice_to_file (a catching-up slave's receive):
    socket bytes land in the file at the offset asked, never more than ``count``, the pipe
    is empty after every call, an empty socket is -EAGAIN and a closed peer 0."""
    splice = native.splice_to_file if engine_name == "native" else py.splice_to_file
    data = rand_bytes(300_000, 11)
    path = tmp_path / "segment"
    path.write_bytes(b"\xee" * (1 << 20))
    pipe = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)  # 64 KiB: several rounds per call
    try:
        with tcp_pair() as (sender, receiver), open(path, "r+b") as f:
            receiver.setblocking(False)
            assert splice(receiver.fileno(), pipe, f.fileno(), 0, 100) == -errno.EAGAIN
            at = 1000
            splice_all(splice, sender, receiver, pipe, f.fileno(), at, data, first_count=100)
            sender.close()
            assert select.select([receiver], [], [], 5)[0]  # the peer's close
            assert splice(receiver.fileno(), pipe, f.fileno(), 0, 100) == 0
        assert splice(-1, pipe, -1, 0, 10) == -errno.EBADF
        content = path.read_bytes()
        assert content[at:at + len(data)] == data
        assert content[:at] == b"\xee" * at
        assert content[at + len(data):] == b"\xee" * ((1 << 20) - at - len(data))
    finally:
        for fd in pipe:
            os.close(fd)


@pytest.mark.parametrize("engine_name", ["native", "python"])
def test_splice_to_file_copies_into_a_file_that_refuses_splice(tmp_path, engine_name):
    """A file splice refuses (here one opened O_APPEND) still gets every byte taken from the
    socket, by read and pwrite from the pipe, and the pipe is left empty."""
    splice = native.splice_to_file if engine_name == "native" else py.splice_to_file
    data = rand_bytes(200_000, 12)
    path = tmp_path / "appended"
    path.write_bytes(b"head")
    pipe = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        with tcp_pair() as (sender, receiver):
            splice_all(splice, sender, receiver, pipe, fd, 4, data)
    finally:
        os.close(fd)
        for end in pipe:
            os.close(end)
    assert path.read_bytes() == b"head" + data


@pytest.mark.parametrize("engine_name", ["native", "python"])
def test_sendfile(tmp_path, engine_name):
    """th_sendfile, and both engines' sendfile (the HA writer's zero-copy path), the same."""
    sendfile = native.sendfile if engine_name == "native" else py.sendfile
    data = rand_bytes(100_000, 9)
    path = tmp_path / "seg"
    path.write_bytes(data)
    a, b = socket.socketpair()
    try:
        with open(path, "rb") as f:
            n = sendfile(a.fileno(), f.fileno(), 1000, 5000)
            assert n == 5000
            got = b""
            while len(got) < n:
                got += b.recv(n - len(got))
            assert got == data[1000:6000]
            a.setblocking(False)
            total = 0
            while True:  # fill the socket buffer: the call reports -EAGAIN, not an error
                n = sendfile(a.fileno(), f.fileno(), 0, len(data))
                if n < 0:
                    assert n == -errno.EAGAIN
                    break
                total += n
                assert total < 1 << 30
        assert sendfile(-1, -1, 0, 10) == -errno.EBADF
    finally:
        a.close()
        b.close()


# ---- th_gather: the records a pull serves, from consume-queue entries ------------------------

GATHER_TOPIC, GATHER_QUEUE = b"T", 3
#: where the body of a v1 record with IPv4 hosts starts
BODY_AT_V1_IPV4 = 88
GATHER_KINDS = ["ok"] * 10 + ["blank", "removed", "elsewhere", "beyond", "bad_size", "neg_size",
                              "misplaced", "flipped", "wrong_offset", "other_queue"]


@st.composite
def gather_cases(draw) -> dict:
    """A segment holding one queue's records (with another queue's between some), and
    consume-queue entries for them: mostly right, some blank, below the log's min offset, in
    another segment, past the readable end, with a wrong size, pointing at the wrong bytes,
    at a record whose body was flipped, at the queue's next record or another queue's; and
    the filters and limits of a pull."""
    base = draw(st.integers(0, 2**40))
    buf = bytearray(draw(st.binary(max_size=5)))
    first = draw(st.integers(0, 1000))
    records = []  # (position, size, tags code) of the queue's records, in queue order
    others = []
    for i in range(draw(st.integers(0, 30))):
        if draw(st.integers(0, 3)) == 0:
            others.append((len(buf), 0))
            cq_record(buf, base, b"U", 1, i)
            others[-1] = (others[-1][0], len(buf) - others[-1][0])
        tag = draw(st.sampled_from([None, "a", "b"]))
        at = len(buf)
        cq_record(buf, base, GATHER_TOPIC, GATHER_QUEUE, first + i, tags=tag,
                  body=b"x" * draw(st.integers(0, 30)))
        records.append((at, len(buf) - at, rec.java_string_hash(tag) if tag else 0))
    readable = len(buf)
    buf += bytes(draw(st.integers(0, 40)))
    entries = bytearray()
    for i, (at, size, code) in enumerate(records):
        kind = draw(st.sampled_from(GATHER_KINDS))
        phys = base + at
        if kind == "blank":
            entries += layout.CQ_BLANK_ENTRY
            continue
        if kind == "removed":
            phys = base - draw(st.integers(1, 100))
        elif kind == "elsewhere":
            phys = base + len(buf) + draw(st.integers(0, 100))
        elif kind == "beyond":
            readable = min(readable, at + draw(st.integers(0, size - 1)))
        elif kind == "bad_size":
            size += draw(st.sampled_from([-1, 1, 8]))
        elif kind == "neg_size":
            size = draw(st.sampled_from([0, -1, -(2**31)]))
        elif kind == "misplaced":
            phys += draw(st.sampled_from([-1, 1, 4]))
        elif kind == "flipped":
            buf[at + size - 10] ^= 0x20  # a byte of the body or topic or properties
        elif kind == "wrong_offset" and i + 1 < len(records):
            phys, size, code = base + records[i + 1][0], records[i + 1][1], records[i + 1][2]
        elif kind == "other_queue" and others:
            o_at, o_size = draw(st.sampled_from(others))
            phys, size = base + o_at, o_size
        entries += layout.CQ_ENTRY.pack(phys, size, code)
    return dict(
        buf=bytes(buf), base=base, entries=bytes(entries), first=first,
        min_offset=base + draw(st.sampled_from([0, 0, 0, 1, 200])),
        readable_end=base + draw(st.sampled_from([readable, readable, len(buf), 0, 100])),
        tags=draw(st.sampled_from([None, None, (rec.java_string_hash("a"),),
                                   (0, rec.java_string_hash("b"))])),
        flags=draw(st.sampled_from([0, backend.GATHER_VERIFY, backend.GATHER_VERIFY])),
        max_count=draw(st.sampled_from([1, 3, 32, 100])),
        max_bytes=draw(st.sampled_from([2**63 - 1, 300, 1000])),
        bytes_before=draw(st.sampled_from([0, 0, 0, 200])),
    )


def gather_with(engine, case):
    return engine.gatherer().gather(
        engine.handle_for(case["buf"]), len(case["buf"]), case["base"], case["min_offset"],
        case["readable_end"], case["entries"], case["tags"], GATHER_TOPIC, GATHER_QUEUE,
        case["first"], case["flags"], MAX_RECORD, case["max_count"], case["max_bytes"],
        case["bytes_before"],
    )


GATHER_FIELDS = ("entries", "found", "stop", "bytes", "last_phys", "problems", "last_problem",
                 "spans", "records", "outcomes")


@settings(SETTINGS, max_examples=300)
@given(gather_cases())
def test_gather_matches_python(case):
    got = gather_with(native, case)
    want = gather_with(py, case)
    assert {f: getattr(got, f) for f in GATHER_FIELDS} == \
        {f: getattr(want, f) for f in GATHER_FIELDS}
    # What it found is what it says: whole records of the queue, in order, spans merged.
    assert got.found <= case["max_count"]
    joined = b"".join(case["buf"][at : at + n] for at, n in got.records)
    assert joined == b"".join(case["buf"][at : at + n] for at, n in got.spans)
    assert len(joined) == got.bytes
    if case["flags"] & backend.GATHER_VERIFY:
        offsets = [case["first"] + i for i, o in enumerate(got.outcomes)
                   if o == backend.GATHER_FOUND]
        decoded = [rec.decode_record(case["buf"][at : at + n], check_crc=True)
                   for at, n in got.records]
        assert [m.queue_offset for m in decoded] == offsets
        assert all(m.queue_id == GATHER_QUEUE and m.topic == "T" for m in decoded)


def test_gather_known_sequence():
    """One queue's five records, the third's entry blank and the fourth's body flipped, with
    another queue's record between the first two: what each entry gets, and the spans (the
    second and third found records are adjacent in the log: one span)."""
    base, buf, records = 5000, bytearray(), []
    for i in range(5):
        if i == 1:
            cq_record(buf, base, b"U", 1, 0)
        at = len(buf)
        cq_record(buf, base, GATHER_TOPIC, GATHER_QUEUE, 10 + i, tags="a")
        records.append((at, len(buf) - at))
    buf[records[3][0] + BODY_AT_V1_IPV4] ^= 1  # the fourth record's body: its CRC fails
    code = rec.java_string_hash("a")
    entries = b"".join(
        layout.CQ_BLANK_ENTRY if i == 2 else layout.CQ_ENTRY.pack(base + at, n, code)
        for i, (at, n) in enumerate(records))
    case = dict(buf=bytes(buf), base=base, entries=entries, first=10, min_offset=base,
                readable_end=base + len(buf), tags=None, flags=backend.GATHER_VERIFY,
                max_count=32, max_bytes=2**63 - 1, bytes_before=0)
    for engine in (native, py):
        got = gather_with(engine, case)
        assert list(got.outcomes) == [backend.GATHER_FOUND, backend.GATHER_FOUND,
                                      backend.GATHER_REMOVED, backend.GATHER_INVALID,
                                      backend.GATHER_FOUND]
        assert got.records == [records[0], records[1], records[4]]
        assert got.spans == [records[0], records[1], records[4]]  # the blank one sits between
        assert (got.entries, got.found, got.stop) == (5, 3, backend.GATHER_END)
        assert (got.problems, got.last_problem) == (2, backend.GATHER_INVALID)
        assert got.last_phys == base + records[4][0]
        # Without the check the flipped record is served, and the two adjacent ones merge.
        got = gather_with(engine, {**case, "flags": 0})
        assert got.records == [records[0], records[1], records[3], records[4]]
        assert got.spans == [records[0], records[1], (records[3][0], records[3][1] * 2)]
        # Limits: by count, then by bytes (the first record is always taken).
        got = gather_with(engine, {**case, "max_count": 2})
        assert (got.entries, got.found, got.stop) == (2, 2, backend.GATHER_COUNT)
        got = gather_with(engine, {**case, "max_bytes": records[0][1] + 1})
        assert (got.entries, got.found, got.stop) == (1, 1, backend.GATHER_BYTES)
        got = gather_with(engine, {**case, "max_bytes": 1, "bytes_before": 1})
        assert (got.entries, got.found, got.stop) == (0, 0, backend.GATHER_BYTES)
        # A tag filter that matches nothing: every entry is looked at, none found.
        got = gather_with(engine, {**case, "tags": (code + 1,)})
        assert (got.entries, got.found) == (5, 0)
        assert list(got.outcomes) == [backend.GATHER_FILTERED] * 2 + [
            backend.GATHER_REMOVED] + [backend.GATHER_FILTERED] * 2


@pytest.mark.parametrize("engine_name", ["native", "python"])
def test_decode_records_matches_decode_record(engine_name):
    """decode_records (a pull body at once; the native engine from one th_scan) gives what
    decode_record gives record by record, and refuses a body that is not whole records."""
    engine = native if engine_name == "native" else py
    buf = bytearray()
    for i in range(20):
        cq_record(buf, 77, b"Topic-\xc3\xa9" if i % 3 else b"T", i % 4, i,
                  tags=f"t{i}" if i % 2 else None, body=rand_bytes(i * 37, i))
    body = bytes(buf)
    extra = {"MIN_OFFSET": "0", "MAX_OFFSET": "99"}
    want, position = [], 0
    while position < len(body):
        want.append(rec.decode_record(body, position, extra_properties=extra))
        position += want[-1].size
    assert engine.decode_records(body, extra_properties=extra) == want
    assert engine.decode_records(b"") == []
    for bad in (body[:-1], body + b"\0" * 8, body[:40], b"\xff" * 100):
        with pytest.raises(rec.RecordDecodeError):
            engine.decode_records(bad)
    with pytest.raises(rec.RecordDecodeError):
        engine.decode_records(body, max_size=want[0].size - 1)
