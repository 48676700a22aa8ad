"""The AutoSwitch (controller mode) HA state machines, alone and as a pair, without sockets.

The golden frames are packed here from the layout in docs/ha-protocol.md ('AutoSwitch') and
RocketMQ 5.3.3's AutoSwitchHAClient / AutoSwitchHAConnection, field by field, never with the
module's own structs, so an encoder and decoder that agree on a wrong layout still fail.
"""

import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_ha.wire.ha_autoswitch import (
    MAX_EPOCH_ENTRIES,
    NEED_DATA,
    AutoSwitchMasterProtocol,
    AutoSwitchSlaveProtocol,
    Batch,
    EpochStart,
    FrameData,
    FrameEnd,
    HandshakeReply,
    HAProtocolError,
    HAState,
    OffsetMismatch,
    SlaveAck,
    SlaveHandshake,
    TransferHeader,
    plan_batch,
    transfer_start,
)


def drain(protocol):
    events = []
    while (event := protocol.next_event()) is not NEED_DATA:
        events.append(event)
    return events


def chop(data: bytes, rng: random.Random):
    pos = 0
    while pos < len(data):
        n = rng.randint(1, 40)
        yield data[pos : pos + n]
        pos += n


def handshake_bytes(state=1, sync_from_last_file=0, async_learner=0, broker_id=2):
    return struct.pack(">ihhq", state, sync_from_last_file, async_learner, broker_id)


def reply_bytes(max_offset, last_epoch, entries, state=1):
    body = b"".join(struct.pack(">iq", epoch, start) for epoch, start in entries)
    return struct.pack(">iiqi", state, len(body), max_offset, last_epoch) + body


def transfer_bytes(offset, body, epoch, epoch_start, confirm, state=2):
    return struct.pack(">iiqiqq", state, len(body), offset, epoch, epoch_start, confirm) + body


def ack_bytes(offset, state=2):
    return struct.pack(">iq", state, offset)


ONE_EPOCH = (EpochStart(1, 0),)


def master_in_transfer(request=0, epochs=ONE_EPOCH, max_offset=10**6):
    master = AutoSwitchMasterProtocol()
    master.receive_data(handshake_bytes())
    assert drain(master) == [SlaveHandshake(2, False, False)]
    master.send_handshake_reply(list(epochs), max_offset)
    master.receive_data(ack_bytes(request))
    assert drain(master) == [SlaveAck(request, first=True)]
    return master


def slave_in_transfer(log_end=0, broker_id=2):
    slave = AutoSwitchSlaveProtocol(broker_id=broker_id)
    slave.receive_data(reply_bytes(10**6, 1, [(1, 0)]))
    assert drain(slave) == [HandshakeReply(10**6, 1, (EpochStart(1, 0),))]
    slave.start_transfer(log_end)
    return slave


# ---- golden bytes, both directions ---------------------------------------------------------


def test_golden_slave_handshake():
    slave = AutoSwitchSlaveProtocol(broker_id=7, sync_from_last_file=True)
    assert slave.send_handshake() == struct.pack(">ihhq", 1, 1, 0, 7)
    assert len(slave.send_handshake()) == 16
    learner = AutoSwitchSlaveProtocol(broker_id=2**40, async_learner=True)
    assert learner.send_handshake() == struct.pack(">ihhq", 1, 0, 1, 2**40)
    master = AutoSwitchMasterProtocol()
    master.receive_data(struct.pack(">ihhq", 1, 1, 0, 7))
    assert master.next_event() == SlaveHandshake(7, sync_from_last_file=True, async_learner=False)
    assert master.handshake == SlaveHandshake(7, True, False)
    assert master.reply_due and master.state is HAState.HANDSHAKE


def test_golden_handshake_reply():
    master = AutoSwitchMasterProtocol()
    master.receive_data(handshake_bytes())
    drain(master)
    reply = master.send_handshake_reply([EpochStart(1, 0), EpochStart(3, 4096)], 9000)
    golden = (
        struct.pack(">iiqi", 1, 24, 9000, 3) + struct.pack(">iq", 1, 0) + struct.pack(">iq", 3, 4096)
    )
    assert reply == golden
    assert len(golden) == 20 + 2 * 12
    assert not master.reply_due
    slave = AutoSwitchSlaveProtocol(broker_id=2)
    slave.receive_data(golden)
    assert drain(slave) == [HandshakeReply(9000, 3, (EpochStart(1, 0), EpochStart(3, 4096)))]


def test_golden_handshake_reply_of_a_master_without_epochs():
    master = AutoSwitchMasterProtocol()
    master.receive_data(handshake_bytes())
    drain(master)
    assert master.send_handshake_reply([], 0) == struct.pack(">iiqi", 1, 0, 0, -1)
    slave = AutoSwitchSlaveProtocol(broker_id=1)
    slave.receive_data(struct.pack(">iiqi", 1, 0, 0, -1))
    assert drain(slave) == [HandshakeReply(0, -1, ())]


def test_golden_transfer_frame_and_ack():
    master = master_in_transfer(request=4096, epochs=(EpochStart(1, 0), EpochStart(3, 4096)))
    header = master.send_transfer_header(4096, 5, 3, 4096, 4000)
    golden = struct.pack(">iiqiqq", 2, 5, 4096, 3, 4096, 4000)
    assert header == golden and len(golden) == 36
    slave = slave_in_transfer(log_end=4096)
    slave.receive_data(golden + b"hello")
    assert drain(slave) == [
        TransferHeader(4096, 5, 3, 4096, 4000, new_epoch=True),
        FrameData(b"hello"),
        FrameEnd(4096, 5),
    ]
    assert slave.expected == 4101 and slave.epoch == 3
    assert slave.send_ack(4101) == struct.pack(">iq", 2, 4101)
    master.receive_data(struct.pack(">iq", 2, 4101))
    assert master.next_event() == SlaveAck(4101)
    assert master.last_ack == 4101


def test_golden_heartbeat():
    master = master_in_transfer(request=100)
    assert master.send_heartbeat(100, 1, 0, 100) == struct.pack(">iiqiqq", 2, 0, 100, 1, 0, 100)


def test_state_ordinals_are_rocketmqs():
    assert [s.value for s in HAState] == [0, 1, 2, 3, 4]
    assert [s.name for s in HAState] == ["READY", "HANDSHAKE", "TRANSFER", "SUSPEND", "SHUTDOWN"]


# ---- what a real RocketMQ 5.3.3 peer sends is accepted ------------------------------------


def test_empty_rocketmq_master_heartbeats_at_minus_one_to_an_empty_slave():
    """A master with no segment (getMinOffset -1) heartbeats at offset -1, labelled with
    its first epoch, and a confirm offset that may still be -1."""
    slave = slave_in_transfer(log_end=0)
    slave.receive_data(transfer_bytes(-1, b"", 1, 0, -1))
    assert drain(slave) == [TransferHeader(-1, 0, 1, 0, -1, new_epoch=True)]
    assert slave.expected == 0  # a heartbeat does not fix where an empty slave starts
    slave.receive_data(transfer_bytes(0, b"abc", 1, 0, 3))
    assert drain(slave) == [
        TransferHeader(0, 3, 1, 0, 3, new_epoch=False),
        FrameData(b"abc"),
        FrameEnd(0, 3),
    ]
    assert slave.expected == 3


def test_minus_one_is_refused_from_a_master_to_a_slave_with_data():
    slave = slave_in_transfer(log_end=100)
    slave.receive_data(transfer_bytes(-1, b"", 1, 0, 0))
    with pytest.raises(HAProtocolError, match="out of range"):
        slave.next_event()
    data = slave_in_transfer(log_end=0)
    data.receive_data(transfer_bytes(-1, b"x", 1, 0, 0))
    with pytest.raises(HAProtocolError, match="out of range"):
        data.next_event()


def test_rocketmq_labels_the_frame_that_ends_an_epoch_with_the_next_epoch():
    """AutoSwitchHAConnection cuts a batch at the epoch's end, moves to the next epoch, then
    builds the header: the last bytes of epoch 1 arrive labelled (2, their end)."""
    slave = slave_in_transfer(log_end=90)
    slave.receive_data(transfer_bytes(90, b"0123456789", 2, 100, 100))
    assert drain(slave)[0] == TransferHeader(90, 10, 2, 100, 100, new_epoch=True)
    slave.receive_data(transfer_bytes(100, b"ab", 2, 100, 100))
    assert drain(slave)[0] == TransferHeader(100, 2, 2, 100, 100, new_epoch=False)
    beyond = slave_in_transfer(log_end=90)
    beyond.receive_data(transfer_bytes(90, b"0123456789", 2, 101, 100))
    with pytest.raises(HAProtocolError, match="beyond the frame's end"):
        beyond.next_event()


def test_slave_repeats_its_handshake_and_a_burst_gets_one_reply():
    master = AutoSwitchMasterProtocol()
    master.receive_data(handshake_bytes() * 50)
    assert drain(master) == [SlaveHandshake(2, False, False)]
    master.send_handshake_reply([EpochStart(1, 0)], 10)
    assert not master.reply_due
    master.receive_data(handshake_bytes())  # five seconds without a reply: it asks again
    assert drain(master) == [SlaveHandshake(2, False, False)]
    assert master.reply_due


# ---- the epoch list: bounds, order, the 1000-entry buffer ----------------------------------


def test_a_master_with_more_than_1000_epochs_sends_the_newest_1000():
    epochs = [EpochStart(i + 1, i * 10) for i in range(MAX_EPOCH_ENTRIES + 5)]
    master = AutoSwitchMasterProtocol()
    master.receive_data(handshake_bytes())
    drain(master)
    reply = master.send_handshake_reply(epochs, 10**6)
    kept = [(e.epoch, e.start_offset) for e in epochs[-MAX_EPOCH_ENTRIES:]]
    assert reply == reply_bytes(10**6, MAX_EPOCH_ENTRIES + 5, kept)
    slave = AutoSwitchSlaveProtocol(broker_id=2)
    slave.receive_data(reply)
    (event,) = drain(slave)
    assert len(event.epochs) == MAX_EPOCH_ENTRIES
    assert event.epochs[0] == EpochStart(6, 50) and event.last_epoch == MAX_EPOCH_ENTRIES + 5


def test_a_reply_claiming_more_than_1000_epochs_is_refused_before_its_body():
    slave = AutoSwitchSlaveProtocol(broker_id=2)
    slave.receive_data(struct.pack(">iiqi", 1, 12 * (MAX_EPOCH_ENTRIES + 1), 0, 1))
    with pytest.raises(HAProtocolError, match="not an epoch list"):
        slave.next_event()


@pytest.mark.parametrize(
    "reply",
    [
        struct.pack(">iiqi", 1, 13, 0, 1) + b"\x00" * 13,  # not a multiple of 12
        struct.pack(">iiqi", 1, -12, 0, 1),
        reply_bytes(-1, -1, []),  # negative master offset
        reply_bytes(100, 2, [(2, 0), (1, 50)]),  # epochs going backwards
        reply_bytes(100, 2, [(1, 60), (2, 50)]),  # starts going backwards
        reply_bytes(100, 1, [(1, 0), (1, 50)]),  # an epoch twice
        reply_bytes(100, 2, [(1, 0), (2, 150)]),  # an epoch beyond the master's log
        reply_bytes(100, -5, [(-5, 0)]),  # a negative epoch
        reply_bytes(100, 1, [(1, 0), (2, 50)]),  # last epoch older than the list's
        reply_bytes(100, 1, [(1, 0)], state=2),  # a transfer frame during the handshake
        reply_bytes(100, 1, [(1, 0)], state=0),
    ],
)
def test_broken_replies_are_protocol_errors(reply):
    slave = AutoSwitchSlaveProtocol(broker_id=2)
    slave.receive_data(reply)
    with pytest.raises(HAProtocolError):
        slave.next_event()


def test_last_epoch_may_be_newer_than_the_list_it_was_read_apart_from():
    slave = AutoSwitchSlaveProtocol(broker_id=2)
    slave.receive_data(reply_bytes(100, 3, [(1, 0), (2, 50)]))
    assert drain(slave) == [HandshakeReply(100, 3, (EpochStart(1, 0), EpochStart(2, 50)))]


def test_master_refuses_to_send_an_epoch_list_no_master_has():
    master = AutoSwitchMasterProtocol()
    with pytest.raises(RuntimeError):
        master.send_handshake_reply([EpochStart(1, 0)], 10)  # no handshake yet
    master.receive_data(handshake_bytes())
    drain(master)
    with pytest.raises(ValueError, match="not a master's"):
        master.send_handshake_reply([EpochStart(2, 0), EpochStart(1, 5)], 10)
    with pytest.raises(ValueError, match="not a master's"):
        master.send_handshake_reply([EpochStart(1, 20)], 10)
    assert master.reply_due


# ---- the master's side: state, acks ------------------------------------------------------


def test_an_ack_before_the_reply_is_a_protocol_error():
    master = AutoSwitchMasterProtocol()
    master.receive_data(handshake_bytes() + ack_bytes(0))
    assert drain_until_error(master) == [SlaveHandshake(2, False, False)]
    bare = AutoSwitchMasterProtocol()
    bare.receive_data(ack_bytes(0))
    with pytest.raises(HAProtocolError, match="before the master replied"):
        bare.next_event()


def drain_until_error(protocol):
    """The events before the protocol error that must come."""
    events = []
    try:
        while (event := protocol.next_event()) is not NEED_DATA:
            events.append(event)
    except HAProtocolError:
        return events
    raise AssertionError(f"no HAProtocolError after {events}")


@pytest.mark.parametrize("state", [0, 3, 4, 5, -1, 2**31 - 1])
def test_frames_in_other_states_are_protocol_errors_on_both_sides(state):
    master = AutoSwitchMasterProtocol()
    master.receive_data(handshake_bytes(state=state))
    with pytest.raises(HAProtocolError, match="state"):
        master.next_event()
    slave = slave_in_transfer(log_end=10)
    slave.receive_data(transfer_bytes(10, b"", 1, 0, 0, state=state))
    with pytest.raises(HAProtocolError, match="state"):
        slave.next_event()


@pytest.mark.parametrize(
    "handshake",
    [
        handshake_bytes(sync_from_last_file=2),
        handshake_bytes(async_learner=-1),
        handshake_bytes(broker_id=-1),
    ],
)
def test_bad_handshakes_are_protocol_errors(handshake):
    master = AutoSwitchMasterProtocol()
    master.receive_data(handshake)
    with pytest.raises(HAProtocolError, match="handshake"):
        master.next_event()


def test_a_slave_that_changes_its_handshake_is_a_protocol_error():
    master = AutoSwitchMasterProtocol()
    master.receive_data(handshake_bytes(broker_id=2) + handshake_bytes(broker_id=3))
    assert drain_until_error(master) == [SlaveHandshake(2, False, False)]


def test_a_handshake_during_the_transfer_is_a_protocol_error():
    master = master_in_transfer(request=0)
    master.receive_data(handshake_bytes())  # 16 bytes: not an ack, nor a whole number of them
    master.receive_data(b"\x00" * 8)
    with pytest.raises(HAProtocolError, match="state"):
        master.next_event()


def test_a_read_full_of_acks_is_one_event_and_every_state_is_checked():
    master = master_in_transfer(request=100, max_offset=10**7)
    master.send_transfer_header(100, 10000, 1, 0, 0)
    master.receive_data(b"".join(ack_bytes(100 + i) for i in range(5000)) + ack_bytes(5100)[:5])
    assert drain(master) == [SlaveAck(100 + 4999)]
    master.receive_data(ack_bytes(5100)[5:] + ack_bytes(5101))  # completes the torn ack
    assert drain(master) == [SlaveAck(5101)]
    wire = bytearray(b"".join(ack_bytes(5200 + i) for i in range(100)))
    wire[12 * 37 + 3] = 1  # one frame in the middle says HANDSHAKE
    master.receive_data(bytes(wire))
    with pytest.raises(HAProtocolError, match="state"):
        master.next_event()


def test_acks_going_backwards_beyond_what_was_sent_or_negative_are_protocol_errors():
    master = master_in_transfer(request=500)
    master.send_transfer_header(500, 100, 1, 0, 0)
    master.receive_data(ack_bytes(600) + ack_bytes(601)[:4])
    assert drain(master) == [SlaveAck(600)]
    master.receive_data(ack_bytes(601)[4:])
    with pytest.raises(HAProtocolError, match="beyond what this connection sent"):
        master.next_event()
    backwards = master_in_transfer(request=500)
    backwards.receive_data(ack_bytes(499))
    with pytest.raises(HAProtocolError, match="backwards"):
        backwards.next_event()
    negative = master_in_transfer(request=0)
    negative.receive_data(ack_bytes(-1))
    with pytest.raises(HAProtocolError, match="negative"):
        negative.next_event()
    request = AutoSwitchMasterProtocol()
    request.receive_data(handshake_bytes())
    drain(request)
    request.send_handshake_reply([], 0)
    request.receive_data(ack_bytes(-7))
    with pytest.raises(HAProtocolError, match="negative"):
        request.next_event()


def test_the_request_may_be_anywhere_and_restating_it_is_fine():
    master = master_in_transfer(request=5 * 10**6, max_offset=1000)  # a slave ahead
    master.receive_data(ack_bytes(5 * 10**6))  # RocketMQ's 5 s report restates it
    assert drain(master) == [SlaveAck(5 * 10**6)]
    assert master.request == 5 * 10**6


def test_master_sends_nothing_before_the_request_and_only_sane_headers():
    master = AutoSwitchMasterProtocol()
    master.receive_data(handshake_bytes())
    drain(master)
    master.send_handshake_reply([EpochStart(1, 0)], 100)
    with pytest.raises(RuntimeError):
        master.send_transfer_header(0, 10, 1, 0, 0)
    master.receive_data(ack_bytes(0))
    drain(master)
    assert master.request == 0 and master.state is HAState.TRANSFER
    with pytest.raises(RuntimeError):
        master.send_handshake_reply([EpochStart(1, 0)], 100)
    for bad in [
        (0, -1, 1, 0, 0),
        (0, master.max_frame_body + 1, 1, 0, 0),
        (-1, 0, 1, 0, 0),
        (50, 10, 1, 60, 0),  # the label starts after the bytes
        (50, 10, -1, 0, 0),
        (50, 10, 1, 0, -2),
    ]:
        with pytest.raises(ValueError, match="out of range|frame at"):
            master.send_transfer_header(*bad)
    master.send_transfer_header(50, 10, 2, 40, 0)
    with pytest.raises(ValueError, match="after epoch 2"):
        master.send_transfer_header(60, 10, 1, 0, 0)  # labels never go backwards


def test_transfer_start_is_rocketmqs_first_ack_rule():
    def start(request, last_file, min_offset=1 << 30, max_offset=(5 << 30) + 77):
        return transfer_start(
            request,
            min_offset=min_offset,
            max_offset=max_offset,
            segment_size=1 << 30,
            sync_from_last_file=last_file,
        )

    assert start(12345, last_file=False) == 12345
    assert start(12345, last_file=True) == 12345
    assert start(0, last_file=False) == 1 << 30
    assert start(0, last_file=True) == 5 << 30
    assert start(0, last_file=False, min_offset=-1, max_offset=0) is None
    assert start(0, last_file=True, min_offset=-1, max_offset=0) == 0
    with pytest.raises(ValueError, match="out of range"):
        start(-1, last_file=False)


# ---- the slave's side: offsets, labels, bodies --------------------------------------------


def test_a_frame_that_does_not_continue_the_log_is_an_offset_mismatch():
    slave = slave_in_transfer(log_end=5000)
    slave.receive_data(transfer_bytes(4096, b"x" * 10, 1, 0, 0))
    with pytest.raises(OffsetMismatch) as info:
        slave.next_event()
    assert (info.value.expected, info.value.received) == (5000, 4096)


def test_an_empty_slave_starts_where_the_first_data_frame_says():
    slave = slave_in_transfer(log_end=0)
    slave.receive_data(transfer_bytes(8192, b"", 1, 0, 0) + transfer_bytes(8192, b"abc", 1, 0, 0))
    assert [type(e) for e in drain(slave)] == [TransferHeader, TransferHeader, FrameData, FrameEnd]
    assert slave.expected == 8195


def test_the_slave_waits_for_the_caller_to_truncate_and_refuses_a_second_reply():
    slave = AutoSwitchSlaveProtocol(broker_id=2)
    reply = reply_bytes(100, 1, [(1, 0)])
    slave.receive_data(reply + reply)
    assert len(drain(slave)) == 1
    assert slave.next_event() is NEED_DATA  # nothing more until start_transfer
    with pytest.raises(RuntimeError):
        slave.send_ack(0)
    slave.start_transfer(100)
    assert slave.state is HAState.TRANSFER
    with pytest.raises(HAProtocolError, match="state"):
        slave.next_event()
    with pytest.raises(RuntimeError):
        slave.send_handshake()


def test_epoch_labels_never_go_backwards_on_a_connection():
    slave = slave_in_transfer(log_end=100)
    slave.receive_data(transfer_bytes(100, b"", 3, 50, 0))
    assert drain(slave)[0].new_epoch
    slave.receive_data(transfer_bytes(100, b"", 2, 40, 0))
    with pytest.raises(HAProtocolError, match="after epoch 3"):
        slave.next_event()
    moved = slave_in_transfer(log_end=100)
    moved.receive_data(transfer_bytes(100, b"", 3, 50, 0) + transfer_bytes(100, b"", 3, 60, 0))
    assert drain_until_error(moved) == [TransferHeader(100, 0, 3, 50, 0, new_epoch=True)]


@pytest.mark.parametrize(
    "frame",
    [
        struct.pack(">iiqiqq", 2, -1, 0, 1, 0, 0),
        struct.pack(">iiqiqq", 2, 2**31 - 1, 0, 1, 0, 0),
        struct.pack(">iiqiqq", 2, 1, 2**63 - 1, 1, 0, 0),  # would overflow
        struct.pack(">iiqiqq", 2, 0, -5, 1, 0, 0),
        struct.pack(">iiqiqq", 2, 0, 0, 1, -1, 0),  # a negative epoch start
        struct.pack(">iiqiqq", 2, 0, 0, 1, 0, -2),  # confirm below -1
    ],
)
def test_bad_transfer_headers_are_protocol_errors(frame):
    slave = slave_in_transfer(log_end=0)
    slave.receive_data(frame)
    with pytest.raises(HAProtocolError):
        slave.next_event()


def test_slave_can_receive_bodies_out_of_band():
    slave = slave_in_transfer(log_end=100)
    slave.receive_data(struct.pack(">iiqiqq", 2, 1000, 100, 1, 0, 90) + b"x" * 10)
    assert drain(slave) == [TransferHeader(100, 1000, 1, 0, 90, True), FrameData(b"x" * 10)]
    assert slave.body_remaining == 990 and slave.bytes_wanted == 990
    slave.body_received(500)  # read straight into the log by the adapter
    slave.body_received(490)
    assert slave.next_event() == FrameEnd(100, 1000)
    assert slave.expected == 1100 and slave.bytes_wanted == 36
    with pytest.raises(RuntimeError):
        slave.body_received(1)


# ---- a whole session, however the streams are cut ------------------------------------------


epoch_lists = st.lists(
    st.tuples(st.integers(1, 3), st.integers(0, 300)), min_size=1, max_size=6
).map(
    lambda steps: [
        EpochStart(sum(e for e, _ in steps[: i + 1]), sum(s for _, s in steps[: i + 1]))
        for i in range(len(steps))
    ]
)


@settings(max_examples=150)
@given(
    epochs=epoch_lists,
    extra=st.integers(0, 400),
    batch=st.integers(1, 64),
    seed=st.integers(0, 2**32),
)
def test_a_session_reaches_the_slave_whole_however_the_streams_are_cut(epochs, extra, batch, seed):
    rng = random.Random(seed)
    log_end = epochs[-1].start_offset + extra
    log = bytes(rng.randrange(256) for _ in range(log_end))
    master = AutoSwitchMasterProtocol()
    slave = AutoSwitchSlaveProtocol(broker_id=3)
    # slave -> master: the handshake, twice (no reply within 5 s)
    for chunk in chop(slave.send_handshake() * 2, rng):
        master.receive_data(chunk)
    assert drain(master) == [SlaveHandshake(3, False, False)]
    wire = bytearray(master.send_handshake_reply(epochs, log_end))
    # master -> slave: the reply; the slave (empty) starts at 0
    replies = []
    for chunk in chop(bytes(wire), rng):
        slave.receive_data(chunk)
        replies += drain(slave)
    assert replies == [HandshakeReply(log_end, epochs[-1].epoch, tuple(epochs))]
    slave.start_transfer(0)
    for chunk in chop(slave.send_ack(0), rng):
        master.receive_data(chunk)
    assert drain(master) == [SlaveAck(0, first=True)]
    # an empty slave's request of 0: from the master's first byte, where its first epoch began
    first = epochs[0].start_offset
    start = transfer_start(
        0, min_offset=first, max_offset=log_end, segment_size=1 << 30, sync_from_last_file=False
    )
    assert start is not None and start == first
    # master: batches that never cross an epoch, then a heartbeat
    wire = bytearray()
    offset = start
    sent_labels = []
    epochs_sent = []
    while offset < log_end:
        planned = plan_batch(epochs, offset, min(log_end, offset + batch))
        assert planned is not None
        wire += master.send_batch_header(planned, confirm_offset=offset) + log[offset : planned.end]
        sent_labels.append((planned.offset, planned.end, planned.epoch))
        epochs_sent.append((planned.epoch, planned.epoch_start_offset))
        offset = planned.end
    last = plan_batch(epochs, offset, offset)
    assert last is not None
    wire += master.send_batch_header(last, confirm_offset=offset)
    epochs_sent.append((last.epoch, last.epoch_start_offset))
    received = bytearray()
    headers = []
    for chunk in chop(bytes(wire), rng):
        slave.receive_data(chunk)
        for event in drain(slave):
            if isinstance(event, FrameData):
                received += event.data
            elif isinstance(event, TransferHeader):
                headers.append(event)
    assert bytes(received) == log[start:]
    assert slave.expected == (log_end if log_end > start else 0)  # heartbeats fix no start
    data_headers = [h for h in headers if h.size]
    assert [(h.offset, h.offset + h.size, h.epoch) for h in data_headers] == sent_labels
    # each epoch is announced once, at the first frame carrying it, with its start; the
    # last one (which holds the log end) always is, by the heartbeat if by nothing else
    announced = [(h.epoch, h.epoch_start_offset) for h in headers if h.new_epoch]
    assert announced == list(dict.fromkeys(epochs_sent))
    assert announced[-1] == (epochs[-1].epoch, epochs[-1].start_offset)
    assert all(EpochStart(*pair) in epochs for pair in announced)
    # slave -> master: acks, streamed; the master ends at the last one
    acks = b"".join(slave.send_ack(h.offset + h.size) for h in data_headers)
    seen = []
    for chunk in chop(acks, rng):
        master.receive_data(chunk)
        seen += drain(master)
    if data_headers:
        assert seen[-1] == SlaveAck(log_end)
    assert master.sent_end == (log_end if data_headers else -1)


mutations = st.lists(
    st.tuples(
        st.sampled_from(["flip", "cut", "insert", "repeat"]),
        st.integers(0, 10**4),
        st.binary(min_size=1, max_size=24),
    ),
    min_size=1,
    max_size=4,
)


def mutate(stream: bytearray, kind: str, position: int, payload: bytes) -> None:
    at = position % len(stream)
    if kind == "flip":
        stream[at] ^= payload[0] or 1
    elif kind == "cut":
        del stream[at : at + len(payload)]
    elif kind == "insert":
        stream[at:at] = payload
    else:
        stream[at:at] = stream[at : at + len(payload)]


@settings(max_examples=300)
@given(to_slave_mutations=mutations, to_master_mutations=mutations, seed=st.integers(0, 2**32))
def test_any_corruption_parses_or_is_a_protocol_error(to_slave_mutations, to_master_mutations, seed):
    """Flip, cut, insert or repeat bytes anywhere in a real session's streams: each side
    either parses what it gets or raises HAProtocolError, never anything else."""
    rng = random.Random(seed)
    to_slave = bytearray(
        reply_bytes(300, 2, [(1, 0), (2, 100)])
        + transfer_bytes(0, bytes(range(60)), 1, 0, -1)
        + transfer_bytes(60, bytes(40), 2, 100, 50)
        + transfer_bytes(100, b"z" * 30, 2, 100, 100)
        + transfer_bytes(130, b"", 2, 100, 130)
    )
    to_master = bytearray(handshake_bytes() * 2 + ack_bytes(0) + ack_bytes(60) + ack_bytes(130))
    for stream, changes in ((to_slave, to_slave_mutations), (to_master, to_master_mutations)):
        for change in changes:
            if stream:
                mutate(stream, *change)
    slave = AutoSwitchSlaveProtocol(broker_id=2)
    try:
        for chunk in chop(bytes(to_slave), rng):
            slave.receive_data(chunk)
            for event in drain(slave):
                if isinstance(event, HandshakeReply):
                    slave.start_transfer(0)
    except HAProtocolError:
        pass
    master = AutoSwitchMasterProtocol()
    try:
        for chunk in chop(bytes(to_master), rng):
            master.receive_data(chunk)
            for event in drain(master):
                if isinstance(event, SlaveHandshake) and master.reply_due:
                    master.send_handshake_reply([EpochStart(1, 0), EpochStart(2, 100)], 300)
                elif isinstance(event, SlaveAck) and event.first:
                    master.send_transfer_header(0, 130, 1, 0, 0)
    except HAProtocolError:
        pass


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_garbage_gives_only_typed_errors(data):
    for protocol in (
        AutoSwitchMasterProtocol(),
        AutoSwitchSlaveProtocol(broker_id=1),
        master_in_transfer(request=0),
        slave_in_transfer(log_end=0),
        slave_in_transfer(log_end=4096),
    ):
        protocol.receive_data(data)
        try:
            drain(protocol)
        except HAProtocolError:
            pass


# ---- the epoch boundary rule --------------------------------------------------------------


@given(epochs=epoch_lists, offset=st.integers(0, 2000), room=st.integers(0, 2000))
def test_a_batch_never_crosses_an_epoch_boundary(epochs, offset, room):
    limit = offset + room
    batch = plan_batch(epochs, offset, limit)
    if offset < epochs[0].start_offset:
        assert batch is None  # the log is older than its epochs: RocketMQ sends nothing
        return
    assert batch is not None
    assert batch.offset == offset and offset <= batch.end <= limit
    # labelled with the epoch that holds offset: the last one starting at or below it
    holding = [e for e in epochs if e.start_offset <= offset][-1]
    assert (batch.epoch, batch.epoch_start_offset) == (holding.epoch, holding.start_offset)
    # no epoch starts strictly inside the batch
    assert not any(offset < e.start_offset < batch.end for e in epochs)
    # it stops early only at an epoch's start, and makes progress whenever it can
    if batch.end < limit:
        assert any(e.start_offset == batch.end for e in epochs)
    if room:
        assert batch.size > 0


@given(epochs=epoch_lists, room=st.integers(1, 500))
def test_batches_cover_the_log_and_each_lies_in_its_epoch(epochs, room):
    end = epochs[-1].start_offset + 100
    offset = epochs[0].start_offset
    while offset < end:
        batch = plan_batch(epochs, offset, min(end, offset + room))
        assert batch is not None and batch.size > 0
        entry = next(e for e in epochs if e.epoch == batch.epoch)
        following = [e.start_offset for e in epochs if e.start_offset > entry.start_offset]
        assert entry.start_offset <= batch.offset
        assert batch.end <= (following[0] if following else end)
        offset = batch.end
    assert offset == end


def test_plan_batch_examples():
    epochs = [EpochStart(1, 0), EpochStart(2, 100), EpochStart(5, 250)]
    assert plan_batch(epochs, 90, 150) == Batch(1, 0, 90, 100)
    assert plan_batch(epochs, 100, 150) == Batch(2, 100, 100, 150)
    assert plan_batch(epochs, 240, 10**9) == Batch(2, 100, 240, 250)
    assert plan_batch(epochs, 250, 10**9) == Batch(5, 250, 250, 10**9)
    assert plan_batch(epochs, 99, 99) == Batch(1, 0, 99, 99)  # a heartbeat's label
    assert plan_batch([], 0, 10) is None
    assert plan_batch([EpochStart(3, 50)], 10, 20) is None
    with pytest.raises(ValueError, match="below its offset"):
        plan_batch(epochs, 10, 5)


def test_the_slave_asks_for_exactly_what_completes_a_reply_or_a_header():
    slave = AutoSwitchSlaveProtocol(broker_id=2)
    reply = reply_bytes(1000, 2, [(1, 0), (2, 500)])
    assert slave.bytes_wanted == 20
    slave.receive_data(reply[:7])
    assert slave.bytes_wanted == 13
    slave.receive_data(reply[7:20])
    assert slave.bytes_wanted == 24
    assert slave.next_event() is NEED_DATA
    slave.receive_data(reply[20:])
    assert isinstance(slave.next_event(), HandshakeReply)
    slave.start_transfer(1000)
    assert slave.bytes_wanted == 36


def test_what_a_real_5_3_3_slave_sends_our_master():
    """The openings a RocketMQ 5.3.3 ``AutoSwitchHAClient`` made against our master in
    tests/test_interop_controller_mixed.py (docs/controller-mode-observed.md). Its request
    is never followed by a smaller ack: a slave with data but no epoch file skips the
    truncation and its first ack is its log end (not 0 and then its end); an empty slave
    sends 0 once haSendHeartbeatInterval has passed; later acks end where frames ended, and
    the periodic report restates the last."""
    # data but no epoch file: log end 3570, master at 7120 with one epoch
    master = AutoSwitchMasterProtocol()
    master.receive_data(handshake_bytes(broker_id=2))
    assert drain(master) == [SlaveHandshake(2, False, False)]
    master.send_handshake_reply([EpochStart(1, 0)], 7120)
    master.receive_data(ack_bytes(3570))
    assert drain(master) == [SlaveAck(3570, first=True)]
    master.send_transfer_header(3570, 7120 - 3570, 1, 0, 3570)
    master.receive_data(ack_bytes(7120))
    master.receive_data(ack_bytes(7120))  # the 1 s report restates it
    assert drain(master) == [SlaveAck(7120)]
    # an empty slave: its request is 0, then its acks follow the frames
    empty = master_in_transfer(request=0, max_offset=3570)
    empty.send_transfer_header(0, 3570, 1, 0, 3570)
    empty.receive_data(ack_bytes(3570))
    assert drain(empty) == [SlaveAck(3570)]
    assert (empty.request, empty.last_ack) == (0, 3570)
