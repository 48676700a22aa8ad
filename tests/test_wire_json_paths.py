"""The JSON header's two paths give one answer (issue 11).

orjson reads and writes the plain headers; the standard library reads and writes everything
else and is the contract (``trio_ha.wire.remoting.serialize``). These tests run both paths on
the same input and compare: the values decoded or the error raised, and the bytes encoded.
They also pin which inputs must leave the fast path, each of which orjson would read or
write differently from the contract if it kept them.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_ha.wire.errors import RemotingDecodeError
from trio_ha.wire.remoting import LanguageCode, RemotingCommand, frames
from trio_ha.wire.remoting.serialize import (
    _decode_json_header_exactly,
    _encode_json_header_formatted,
    decode_json_header,
    encode_json_header,
)

SWEEP = settings(max_examples=400, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def outcome(decode, header: bytes) -> tuple[str, object]:
    try:
        return "values", decode(header)
    except RemotingDecodeError as exc:
        return "error", str(exc)


def assert_same_reading(header: bytes) -> None:
    assert outcome(decode_json_header, header) == outcome(_decode_json_header_exactly, header)


# Text of every kind a header may carry: control characters, quotes and backslashes,
# non-ASCII, the separators of message properties, and lone surrogates.
TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=12)
SCALARS = st.one_of(
    TEXT, st.none(), st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.decimals(allow_nan=False, allow_infinity=False, places=3).map(str).map(float),
)


@SWEEP
@given(
    code=st.one_of(st.integers(-(2**33), 2**33), st.sampled_from([10, 310, 2**70]), SCALARS),
    opaque=st.one_of(st.integers(-(2**31), 2**31 - 1), SCALARS),
    language=st.one_of(st.sampled_from(["JAVA", "PYTHON", "RUST", "NOPE"]), st.integers(0, 20),
                       SCALARS),
    remark=st.one_of(st.none(), TEXT, SCALARS),
    ext=st.one_of(st.none(), st.dictionaries(TEXT, TEXT, max_size=6),
                  st.dictionaries(TEXT, SCALARS, max_size=6), SCALARS),
    drop=st.sets(st.sampled_from(["code", "opaque", "language", "remark", "extFields"])),
)
def test_both_paths_read_any_header_alike(code, opaque, language, remark, ext, drop):
    document = {"code": code, "extFields": ext, "flag": 0, "language": language,
                "opaque": opaque, "remark": remark, "version": 395}
    for key in drop:
        document.pop(key)
    header = json.dumps(document, ensure_ascii=False).encode("utf-8", "surrogatepass")
    assert_same_reading(header)
    # and with \u escapes for everything past ASCII (lone surrogates included)
    assert_same_reading(json.dumps(document).encode())


@SWEEP
@given(st.binary(max_size=200), st.integers(0, 190))
def test_both_paths_read_broken_headers_alike(noise, at):
    """Valid headers with bytes spliced in (malformed UTF-8, cut strings, stray tokens)."""
    valid = encode_json_header(RemotingCommand(310, opaque=7, ext_fields={"a": "G", "b": "T"}))
    assert_same_reading(valid[:at] + noise + valid[at:])
    assert_same_reading(noise)


@pytest.mark.parametrize(("header", "expect"), [
    # malformed UTF-8 in a value: Java replaces it, orjson refuses the header
    (b'{"code":310,"extFields":{"a":"x\xff"}}', ("values", "x\ufffd")),
    # a lone surrogate escape: kept as the standard library reads it, orjson refuses it
    (b'{"code":310,"extFields":{"a":"\\ud800"}}', ("values", "\ud800")),
    # numbers and booleans in extFields: coerced the way Java renders them
    (b'{"code":310,"extFields":{"a":1.50,"b":true,"c":7}}', ("values", "1.50")),
    # an integer past 64 bits (orjson would read a float): the range error names the field
    (b'{"code":123456789012345678901234567890}', ("error", "'code' is out of range")),
    # null extFields values are dropped, as fastjson's readers treat them as absent
    (b'{"code":310,"extFields":{"a":null,"b":"x"}}', ("values", "x")),
])
def test_headers_that_leave_the_fast_path(header, expect):
    kind, text = expect
    got_kind, got = outcome(decode_json_header, header)
    assert got_kind == kind
    assert_same_reading(header)
    if kind == "values":
        assert isinstance(got, tuple)
        assert text in got[6].values()
    else:
        assert text in str(got)


COMMANDS = st.builds(
    RemotingCommand,
    code=st.integers(-(2**31), 2**31 - 1),
    language=st.sampled_from(list(LanguageCode)),
    version=st.integers(0, 2**15),
    opaque=st.integers(-(2**31), 2**31 - 1),
    flag=st.integers(0, 3),
    remark=st.one_of(st.none(), TEXT),
    ext_fields=st.dictionaries(TEXT, TEXT, max_size=8),
)


@SWEEP
@given(COMMANDS, st.one_of(st.none(), st.integers(0, 2**31 - 1)))
def test_both_paths_write_any_command_alike(command, opaque):
    fast = encode_json_header(command, opaque)
    assert fast == _encode_json_header_formatted(command, opaque)
    texts = [*command.ext_fields, *command.ext_fields.values(), command.remark or ""]
    if any("\ud800" <= c <= "\udfff" for text in texts for c in text):
        return  # written as '?' by both paths (checked above), so not read back as built
    decoded = frames.decode_frame(frames.encode(command, opaque=opaque))
    assert decoded.ext_fields == command.ext_fields
    assert decoded.remark == command.remark
    assert decoded.opaque == (command.opaque if opaque is None else opaque)


def test_values_that_are_not_strings_are_written_as_java_renders_them():
    """A command built by hand with an int value leaves orjson (which would write a JSON
    number) for the format; a lone surrogate is written as '?' as Java's getBytes does."""
    command = RemotingCommand(310, ext_fields={"queueId": "3"})
    typed = RemotingCommand(310, ext_fields={"queueId": 3})  # type: ignore[dict-item]
    with pytest.raises(TypeError):
        encode_json_header(typed)  # the contract path refuses it too: fields are strings
    surrogate = RemotingCommand(310, ext_fields={"k": "a\ud800b"})
    assert encode_json_header(surrogate) == _encode_json_header_formatted(surrogate, None)
    assert b'"k":"a?b"' in encode_json_header(surrogate)
    assert encode_json_header(command) == _encode_json_header_formatted(command, None)
