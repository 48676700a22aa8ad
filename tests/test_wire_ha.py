"""The classic HA protocol state machines, alone and as a pair, without sockets."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_ha.wire.ha import (
    NEED_DATA,
    FrameData,
    FrameEnd,
    FrameHeader,
    HAProtocolError,
    MasterProtocol,
    OffsetMismatch,
    SlaveProtocol,
    SlaveReport,
)


def drain(protocol):
    events = []
    while (event := protocol.next_event()) is not NEED_DATA:
        events.append(event)
    return events


def chop(data: bytes, rng: random.Random):
    pos = 0
    while pos < len(data):
        n = rng.randint(1, 20)
        yield data[pos : pos + n]
        pos += n


@given(
    start=st.integers(0, 2**40),
    bodies=st.lists(st.binary(max_size=200), max_size=20),
    seed=st.integers(0, 2**32),
)
def test_master_frames_reach_the_slave_whole_however_the_stream_is_cut(start, bodies, seed):
    master = MasterProtocol(log_end=start + sum(map(len, bodies)))
    wire = bytearray()
    offset = start
    for body in bodies:
        wire += master.send_frame_header(offset, len(body)) + body
        offset += len(body)
    wire += master.send_heartbeat(offset)
    slave = SlaveProtocol(expected=start)
    received = bytearray()
    events = []
    for chunk in chop(bytes(wire), random.Random(seed)):
        slave.receive_data(chunk)
        for event in drain(slave):
            events.append(event)
            if isinstance(event, FrameData):
                received += event.data
    assert bytes(received) == b"".join(bodies)
    assert slave.expected == offset
    ends = [e for e in events if isinstance(e, FrameEnd)]
    assert [e.size for e in ends] == [len(b) for b in bodies if b]
    assert isinstance(events[-1], FrameHeader) and events[-1].is_heartbeat


def test_slave_can_receive_bodies_out_of_band():
    slave = SlaveProtocol(expected=100)
    slave.receive_data(MasterProtocol(log_end=10**6).send_frame_header(100, 1000) + b"x" * 10)
    assert drain(slave) == [FrameHeader(100, 1000), FrameData(b"x" * 10)]
    assert slave.body_remaining == 990
    slave.body_received(500)  # read straight into the log by the adapter
    slave.body_received(490)
    assert slave.next_event() == FrameEnd(100, 1000)
    assert slave.expected == 1100
    with pytest.raises(RuntimeError):
        slave.body_received(1)


@given(reports=st.lists(st.integers(0, 2**50), min_size=1, max_size=30), seed=st.integers(0, 2**32))
def test_reports_survive_torn_reads(reports, seed):
    reports = sorted(reports)
    slave = SlaveProtocol()
    master = MasterProtocol(log_end=2**50)
    wire = b"".join(slave.send_report(r) for r in reports)
    seen = []
    for chunk in chop(wire, random.Random(seed)):
        master.receive_data(chunk)
        events = drain(master)
        # Point 9: one report per read, besides the first of the connection.
        assert len([e for e in events if not e.first]) <= 1
        seen += events
    # The first report whole, then the last one of each read: a subsequence, ending last.
    assert seen[0] == SlaveReport(reports[0], True)
    offsets = iter(reports[1:])
    assert all(any(e.offset == r for r in offsets) for e in seen[1:])
    if len(reports) > 1:
        assert seen[-1] == SlaveReport(reports[-1], False)
    assert master.last_report == reports[-1]


def test_point_9_a_read_full_of_reports_is_one_event():
    """A peer streaming reports costs one event per read, however many it packed in; the
    reports it skips are not even decoded (RocketMQ's master takes the last one too)."""
    master = MasterProtocol(log_end=10**6)
    slave = SlaveProtocol()
    master.receive_data(slave.send_report(100))
    assert drain(master) == [SlaveReport(100, first=True)]
    master.receive_data(b"".join(slave.send_report(100 + i) for i in range(8192)) + b"\x00" * 5)
    assert drain(master) == [SlaveReport(100 + 8191)]
    master.receive_data(b"\x00\x00\x00")  # the torn tail completes a ninth report: 0
    with pytest.raises(HAProtocolError, match="backwards"):
        master.next_event()


def test_an_ack_beyond_the_master_log_is_a_protocol_error_fixes_rocketmq_3015():
    master = MasterProtocol(log_end=1000)
    master.receive_data(SlaveProtocol().send_report(10) + SlaveProtocol().send_report(1001))
    assert master.next_event() == SlaveReport(10, first=True)
    with pytest.raises(HAProtocolError, match="beyond the master's log end"):
        master.next_event()


def test_first_report_is_a_request_and_may_be_ahead_of_the_master():
    master = MasterProtocol(log_end=1000)
    master.receive_data(SlaveProtocol().send_report(5000))
    assert master.next_event() == SlaveReport(5000, first=True)


def test_reports_going_backwards_or_negative_are_protocol_errors():
    master = MasterProtocol(log_end=1000)
    master.receive_data(SlaveProtocol().send_report(500) + SlaveProtocol().send_report(400))
    assert master.next_event() == SlaveReport(500, first=True)
    with pytest.raises(HAProtocolError, match="backwards"):
        master.next_event()
    negative = MasterProtocol(log_end=1000)
    negative.receive_data(b"\xff" * 8)
    with pytest.raises(HAProtocolError, match="negative"):
        negative.next_event()


def test_offset_mismatch_is_detected_not_looped_fixes_rocketmq_323():
    slave = SlaveProtocol(expected=5000)
    slave.receive_data(MasterProtocol(log_end=10**6).send_frame_header(4096, 10))
    with pytest.raises(OffsetMismatch) as info:
        slave.next_event()
    assert (info.value.expected, info.value.received) == (5000, 4096)


def test_empty_slave_starts_where_the_first_data_frame_says():
    slave = SlaveProtocol()
    master = MasterProtocol(log_end=10**6)
    slave.receive_data(master.send_heartbeat(8192) + master.send_frame_header(8192, 3) + b"abc")
    assert drain(slave) == [FrameHeader(8192, 0), FrameHeader(8192, 3), FrameData(b"abc"), FrameEnd(8192, 3)]
    assert slave.expected == 8195


@pytest.mark.parametrize(
    "header",
    [
        (0).to_bytes(8, "big") + (-1).to_bytes(4, "big", signed=True),
        (0).to_bytes(8, "big") + (2**31 - 1).to_bytes(4, "big"),
        (-5).to_bytes(8, "big", signed=True) + (1).to_bytes(4, "big"),
    ],
)
def test_bad_frame_headers_are_protocol_errors(header):
    slave = SlaveProtocol()
    slave.receive_data(header)
    with pytest.raises(HAProtocolError):
        slave.next_event()


@settings(max_examples=300)
@given(st.binary(max_size=100))
def test_garbage_gives_only_typed_errors(data):
    for protocol in (SlaveProtocol(expected=0), SlaveProtocol(), MasterProtocol(log_end=2**62)):
        protocol.receive_data(data)
        try:
            drain(protocol)
        except HAProtocolError:
            pass
