"""RocketMQ 5's AutoSwitch HA protocol (controller mode), as two sans-I/O state machines.

The classic protocol (``wire/ha.py``) trusts that offsets line up. A broker set that fails
over cannot: a slave may hold bytes its new master never had, and it must learn that before
it copies anything. So RocketMQ 5 put a handshake in front of the transfer, in which the
master sends its epoch list (the offset at which each master term began), and labels every
transfer frame with the epoch its bytes were written in. All integers big-endian
(docs/ha-protocol.md, 'AutoSwitch'; RocketMQ 5.3.3's ``AutoSwitchHAClient`` and
``AutoSwitchHAConnection``)::

    slave -> master  handshake  state=1:4 isSyncFromLastFile:2 isAsyncLearner:2 brokerId:8
    master -> slave  reply      state=1:4 bodySize:4 maxPhyOffset:8 lastEpoch:4
                                + bodySize/12 x (epoch:4 startOffset:8)
    master -> slave  transfer   state=2:4 bodySize:4 offset:8 epoch:4 epochStartOffset:8
                                confirmOffset:8 + bodySize raw commitlog bytes (0: heartbeat)
    slave -> master  ack        state=2:4 maxPhyOffset:8

Every frame opens with its sender's state, and a frame whose state is not the receiver's is
an error. Between the reply and the first ack the slave truncates its log to the last point
both logs agree on (the callers' business, not this module's); its first ack is then its
request, where the master starts.

What the state machines check beyond what RocketMQ checks (sizes, signs, an epoch list that
goes backwards, labels that go backwards, an ack beyond what the connection carried, an ack
before the reply) raises ``HAProtocolError``, or ``OffsetMismatch`` for a frame that does
not continue the slave's log: the peer loses its connection, never the node. Anything a real
RocketMQ 5.3.3 peer sends is accepted, its quirks included (a heartbeat at offset -1 from an
empty master, a confirm offset of -1, the last frame of an epoch labelled with the next one).

As with ``wire/ha.py`` and h11: ``receive_data`` feeds bytes, ``next_event`` returns an event
or ``NEED_DATA``, and ``send_*`` return bytes to write. The slave's adapter may receive a
frame body straight into the commitlog mapping and report it with ``body_received(n)``. The
epoch list is whatever sequence of objects with ``epoch`` and ``start_offset`` the caller
keeps (``EpochLike``): this module does not know the epoch file.

Why one module at about 650 lines: the two machines are the two ends of one protocol, and
share its frames, its states and its checks (an epoch list, a transfer's label); each side
encodes what the other decodes, so split, a frame's layout would live in two places.
"""

from __future__ import annotations

import bisect
import enum
import struct
from collections.abc import Sequence
from typing import Protocol

import attrs

from .ha import (
    MAX_FRAME_BODY,
    NEED_DATA,
    FrameData,
    FrameEnd,
    HAProtocolError,
    NeedData,
    OffsetMismatch,
)
from .layout import INT32_MAX, INT64_MAX

__all__ = [
    "ACK",
    "EPOCH_ENTRY",
    "HANDSHAKE",
    "HANDSHAKE_REPLY_HEADER",
    "JAVA_SLAVE_MAX_FRAME_BODY",
    "MAX_EPOCH_ENTRIES",
    "NEED_DATA",
    "TRANSFER_HEADER",
    "AutoSwitchMasterProtocol",
    "AutoSwitchSlaveProtocol",
    "Batch",
    "EpochLike",
    "EpochStart",
    "FrameData",
    "FrameEnd",
    "HAProtocolError",
    "HAState",
    "HandshakeReply",
    "OffsetMismatch",
    "SlaveAck",
    "SlaveHandshake",
    "TransferHeader",
    "plan_batch",
    "transfer_start",
]

HANDSHAKE = struct.Struct(">ihhq")
HANDSHAKE_REPLY_HEADER = struct.Struct(">iiqi")
EPOCH_ENTRY = struct.Struct(">iq")
TRANSFER_HEADER = struct.Struct(">iiqiqq")
ACK = struct.Struct(">iq")
_STATE = struct.Struct(">i")

#: The most epoch entries a handshake reply carries. A RocketMQ 5.3.3 master builds the reply
#: in a buffer of 1000 entries and cannot send more: with a longer list, setting the buffer's
#: limit throws, and every handshake on that master fails. Ours sends the newest 1000 (the
#: only ones a slave that can still catch up needs: it matches on its newest shared epoch),
#: and our slave refuses a reply that claims more.
MAX_EPOCH_ENTRIES = 1000
#: The largest transfer body a RocketMQ slave can take: it reads frames into a 4 MiB buffer
#: and waits for a whole frame there, so a larger one stalls it until its housekeeping drops
#: the connection. Our master's default limit.
JAVA_SLAVE_MAX_FRAME_BODY = 4 * 1024 * 1024 - TRANSFER_HEADER.size


class HAState(enum.IntEnum):
    """RocketMQ's ``HAConnectionState`` ordinals, the first int of every frame."""

    READY = 0
    HANDSHAKE = 1
    TRANSFER = 2
    SUSPEND = 3
    SHUTDOWN = 4


class EpochLike(Protocol):
    """An epoch entry as this module needs it: epoch ``epoch`` began at ``start_offset``.
    The epoch cache's own entries fit, and so does ``EpochStart``."""

    @property
    def epoch(self) -> int: ...

    @property
    def start_offset(self) -> int: ...


@attrs.frozen
class EpochStart:
    """Master epoch ``epoch`` began at log offset ``start_offset`` (one entry of a reply)."""

    epoch: int
    start_offset: int


@attrs.frozen
class SlaveHandshake:
    """The slave opened: its controller brokerId and its two flags."""

    broker_id: int
    sync_from_last_file: bool
    async_learner: bool


@attrs.frozen
class HandshakeReply:
    """The master's answer: its log end, its last epoch (-1: none) and its epoch list."""

    master_max_offset: int
    last_epoch: int
    epochs: tuple[EpochStart, ...]


@attrs.frozen
class SlaveAck:
    """The slave holds its log below ``offset``. The first ack of a connection is its
    request: where the master starts (0: from the master's first byte, or from its last
    segment if the slave's handshake asked for that; see ``transfer_start``)."""

    offset: int
    first: bool = False


@attrs.frozen
class TransferHeader:
    """A transfer frame starts: ``size`` bytes of the master's log at ``offset`` follow
    (0: a heartbeat). ``epoch`` began at ``epoch_start_offset``; ``new_epoch`` says that
    this connection had not seen that epoch yet, so the caller appends the entry to its epoch
    cache. Its start may be the frame's end (RocketMQ labels the frame that ends an epoch with
    the next one), so append it once the body is in. ``confirm_offset`` is the master's
    confirmed end (-1: not computed yet); the slave takes min(it, its own log end)."""

    offset: int
    size: int
    epoch: int
    epoch_start_offset: int
    confirm_offset: int
    new_epoch: bool

    @property
    def is_heartbeat(self) -> bool:
        return self.size == 0


@attrs.frozen
class Batch:
    """What a master sends next from ``offset``: up to ``end``, labelled ``epoch``."""

    epoch: int
    epoch_start_offset: int
    offset: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.offset


def _start_offset(entry: EpochLike) -> int:
    return entry.start_offset


def plan_batch(epochs: Sequence[EpochLike], offset: int, limit: int) -> Batch | None:
    """The batch a master sends from ``offset`` when it could send up to ``limit`` (what is
    written, within the batch size): it never crosses an epoch boundary, so it stops at the
    start of the epoch after the one holding ``offset`` if that comes before ``limit``. The
    label is the epoch its bytes were written in. None when no epoch holds ``offset`` (the
    list is empty, or the log is older than its first entry): RocketMQ sends no data then.

    ``epochs`` is in order (epochs and start offsets ascending); O(log n) per batch."""
    if limit < offset:
        raise ValueError(f"batch limit {limit} is below its offset {offset}")
    at = bisect.bisect_right(epochs, offset, key=_start_offset) - 1
    if at < 0:
        return None
    holding = epochs[at]
    end = limit
    if at + 1 < len(epochs):
        # bisect_right took the last entry starting at or below offset: the next one
        # starts above it, so the batch is never empty for that reason.
        end = min(end, epochs[at + 1].start_offset)
    return Batch(holding.epoch, holding.start_offset, offset, end)


def transfer_start(
    request: int,
    *,
    min_offset: int,
    max_offset: int,
    segment_size: int,
    sync_from_last_file: bool,
) -> int | None:
    """Where a master starts sending, given the slave's first ack: there, unless it is 0,
    which means the master's first byte, or the start of its last segment if the slave's
    handshake set isSyncFromLastFile (RocketMQ's rule). None when the log is empty
    (``min_offset`` -1): nothing to send yet; RocketMQ heartbeats and asks again."""
    if request < 0 or segment_size <= 0:
        raise ValueError(f"request {request} or segment size {segment_size} is out of range")
    if request:
        return request
    if sync_from_last_file:
        return max(0, max_offset - max_offset % segment_size)
    return None if min_offset < 0 else min_offset


def _check_epochs(epochs: Sequence[EpochLike], max_offset: int) -> str | None:
    """Why an epoch list is not one a master can have, or None: epochs strictly ascending
    and non-negative, start offsets ascending (RocketMQ's cache refuses anything else), none
    beyond the master's log end (an epoch begins where the log ended when it was elected)."""
    previous: EpochLike | None = None
    for entry in epochs:
        if not 0 <= entry.epoch <= INT32_MAX:
            return f"epoch {entry.epoch} is out of range"
        if not 0 <= entry.start_offset <= max_offset:
            return f"epoch {entry.epoch} starts at {entry.start_offset}, beyond {max_offset}"
        if previous is not None and (
            entry.epoch <= previous.epoch or entry.start_offset < previous.start_offset
        ):
            return f"epoch {entry.epoch}@{entry.start_offset} does not follow {previous}"
        previous = entry
    return None


def _label_error(
    previous: tuple[int, int], epoch: int, start: int, offset: int, size: int
) -> str | None:
    """Why a transfer frame's epoch label is wrong, or None. The label names the epoch of
    the bytes (or, for the frame that ends an epoch, RocketMQ's next epoch, starting at the
    frame's end); labels never go backwards on a connection, and one epoch has one start."""
    if not 0 <= epoch <= INT32_MAX:
        return f"epoch {epoch} is out of range"
    if start < 0 or (offset >= 0 and start > offset + size):
        return f"epoch {epoch} starts at {start}, beyond the frame's end {offset + size}"
    previous_epoch, previous_start = previous
    if epoch < previous_epoch or start < previous_start:
        return f"epoch {epoch}@{start} after epoch {previous_epoch}@{previous_start}"
    if epoch == previous_epoch and start != previous_start:
        return f"epoch {epoch} moved from {previous_start} to {start}"
    return None


def _check_state_early(buffer: bytearray, expected: HAState) -> None:
    """Refuse a torn header whose state is already wrong: a frame of another state may be
    shorter than the header this side waits for (a second handshake reply after the
    transfer began is 32 bytes), and RocketMQ fails it as soon as it sees the state."""
    if len(buffer) >= _STATE.size:
        (state,) = _STATE.unpack_from(buffer)
        if state != expected:
            raise HAProtocolError(f"frame with state {state} where {expected.name} was expected")


@attrs.define(eq=False)
class AutoSwitchMasterProtocol:
    """The master's side of one slave connection. It starts in HANDSHAKE: it takes the
    slave's handshake, the caller sends the reply (``send_handshake_reply``), and the slave's
    first ack (its request) moves it to TRANSFER, where it decodes acks and encodes transfer
    headers. Compared by identity: it is one connection's live state, not a value."""

    #: the largest body ``send_transfer_header`` allows; a RocketMQ slave takes no more
    max_frame_body: int = JAVA_SLAVE_MAX_FRAME_BODY
    _state: HAState = HAState.HANDSHAKE
    _buffer: bytearray = attrs.field(factory=bytearray)
    _handshake: SlaveHandshake | None = None
    _reply_due: bool = False
    _reply_sent: bool = False
    _request: int | None = None
    _last_ack: int | None = None
    #: the end of the bytes this connection's frames carried (-1: none yet)
    _sent_end: int = -1
    _label: tuple[int, int] = (-1, -1)

    @property
    def state(self) -> HAState:
        return self._state

    @property
    def handshake(self) -> SlaveHandshake | None:
        """The slave's handshake, once it came (its brokerId and flags)."""
        return self._handshake

    @property
    def reply_due(self) -> bool:
        """A handshake waits for its reply (a RocketMQ slave repeats its handshake every
        5 s until it has one)."""
        return self._reply_due

    @property
    def request(self) -> int | None:
        """The slave's first ack: where to start. None until it comes (RocketMQ's -1)."""
        return self._request

    @property
    def last_ack(self) -> int | None:
        return self._last_ack

    @property
    def sent_end(self) -> int:
        return self._sent_end

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        self._buffer += data

    def next_event(self) -> SlaveHandshake | SlaveAck | NeedData:
        if self._state is HAState.TRANSFER:
            return self._next_ack()
        buffer = self._buffer
        if len(buffer) < _STATE.size:
            return NEED_DATA
        (state,) = _STATE.unpack_from(buffer)
        if state == HAState.HANDSHAKE:
            return self._next_handshake()
        if state == HAState.TRANSFER and self._reply_sent:
            if len(buffer) < ACK.size:
                return NEED_DATA
            _, offset = ACK.unpack_from(buffer)
            del buffer[: ACK.size]
            if offset < 0:
                raise HAProtocolError(f"slave requested a negative offset {offset}")
            self._state = HAState.TRANSFER
            self._reply_due = False  # the slave has its reply; another would break it
            self._request = self._last_ack = offset
            return SlaveAck(offset, first=True)
        if state == HAState.TRANSFER:
            raise HAProtocolError("slave acked before the master replied to its handshake")
        raise HAProtocolError(f"frame with state {state} where HANDSHAKE was expected")

    def _next_handshake(self) -> SlaveHandshake | NeedData:
        buffer = self._buffer
        if len(buffer) < HANDSHAKE.size:
            return NEED_DATA
        _, sync_from_last_file, async_learner, broker_id = HANDSHAKE.unpack_from(buffer)
        if sync_from_last_file not in (0, 1) or async_learner not in (0, 1):
            raise HAProtocolError(
                f"handshake flags {sync_from_last_file}, {async_learner} are not 0 or 1"
            )
        if broker_id < 0:
            raise HAProtocolError(f"handshake brokerId {broker_id} is negative")
        handshake = SlaveHandshake(broker_id, bool(sync_from_last_file), bool(async_learner))
        if self._handshake is not None and handshake != self._handshake:
            raise HAProtocolError(f"slave changed its handshake to {handshake}")
        self._handshake = handshake
        # A burst of identical handshakes is one event and asks for one reply, as RocketMQ's
        # master answers once per wake-up: a peer that streams handshakes gets a reply (up to
        # 12 KiB) per read at most, not one per 16 bytes.
        first = buffer[: HANDSHAKE.size]
        end = HANDSHAKE.size
        while buffer[end : end + HANDSHAKE.size] == first:
            end += HANDSHAKE.size
        del buffer[:end]
        self._reply_due = True
        return handshake

    def _next_ack(self) -> SlaveAck | NeedData:
        buffer = self._buffer
        whole = len(buffer) // ACK.size
        if not whole:
            return NEED_DATA
        end = whole * ACK.size
        if whole > 1 and not (
            buffer[0:end:ACK.size].count(0) == whole
            and buffer[1:end:ACK.size].count(0) == whole
            and buffer[2:end:ACK.size].count(0) == whole
            and buffer[3:end:ACK.size].count(HAState.TRANSFER) == whole
        ):
            raise HAProtocolError("a frame in the ack stream has a state other than TRANSFER")
        # Only the last whole ack of what arrived is decoded: each restates the slave's log
        # end, so a later one supersedes the others (as in wire/ha.py), and a peer streaming
        # acks costs one event per read. Their states were checked above, in C.
        state, offset = ACK.unpack_from(buffer, end - ACK.size)
        del buffer[:end]
        if state != HAState.TRANSFER:
            raise HAProtocolError(f"frame with state {state} where TRANSFER was expected")
        if offset < 0:
            raise HAProtocolError(f"slave acked a negative offset {offset}")
        last = self._last_ack
        assert last is not None and self._request is not None
        if offset < last:
            raise HAProtocolError(f"slave ack went backwards from {last} to {offset}")
        if offset > max(self._request, self._sent_end):
            raise HAProtocolError(
                f"slave acked {offset}, beyond what this connection sent ({self._sent_end})"
            )
        self._last_ack = offset
        return SlaveAck(offset)

    def send_handshake_reply(self, epochs: Sequence[EpochLike], max_offset: int) -> bytes:
        """The reply to the slave's handshake: the master's log end and epoch list, of which
        it sends the newest ``MAX_EPOCH_ENTRIES``. ``lastEpoch`` is the list's last (-1 when
        empty), as in RocketMQ."""
        if not self._reply_due:
            raise RuntimeError("no handshake waits for a reply")
        if not 0 <= max_offset <= INT64_MAX:
            raise ValueError(f"max offset {max_offset} is out of range")
        if (problem := _check_epochs(epochs, max_offset)) is not None:
            raise ValueError(f"epoch list is not a master's: {problem}")
        sent = epochs[-MAX_EPOCH_ENTRIES:]
        last_epoch = sent[-1].epoch if sent else -1
        reply = bytearray(HANDSHAKE_REPLY_HEADER.size + EPOCH_ENTRY.size * len(sent))
        HANDSHAKE_REPLY_HEADER.pack_into(
            reply, 0, HAState.HANDSHAKE, EPOCH_ENTRY.size * len(sent), max_offset, last_epoch
        )
        at = HANDSHAKE_REPLY_HEADER.size
        for entry in sent:
            EPOCH_ENTRY.pack_into(reply, at, entry.epoch, entry.start_offset)
            at += EPOCH_ENTRY.size
        self._reply_due = False
        self._reply_sent = True
        return bytes(reply)

    def send_transfer_header(
        self, offset: int, size: int, epoch: int, epoch_start_offset: int, confirm_offset: int
    ) -> bytes:
        """The 36-byte header of a frame whose body (``size`` bytes of the log at ``offset``,
        all written in ``epoch``: see ``plan_batch``) the caller sends next, straight from
        the segment. Only once the slave's request came."""
        if self._state is not HAState.TRANSFER:
            raise RuntimeError("transfer before the slave's first ack")
        if not 0 <= size <= self.max_frame_body:
            raise ValueError(f"frame body of {size} bytes is out of range")
        if not 0 <= offset <= INT64_MAX - size:
            raise ValueError(f"frame offset {offset} is out of range")
        # Our label is the epoch the bytes were written in, so it starts at or below them.
        problem = _label_error(self._label, epoch, epoch_start_offset, offset, 0)
        if problem is not None:
            raise ValueError(f"frame at {offset}: {problem}")
        if not -1 <= confirm_offset <= INT64_MAX:
            raise ValueError(f"confirm offset {confirm_offset} is out of range")
        self._label = (epoch, epoch_start_offset)
        if size:
            self._sent_end = max(self._sent_end, offset + size)
        return TRANSFER_HEADER.pack(
            HAState.TRANSFER, size, offset, epoch, epoch_start_offset, confirm_offset
        )

    def send_batch_header(self, batch: Batch, confirm_offset: int) -> bytes:
        return self.send_transfer_header(
            batch.offset, batch.size, batch.epoch, batch.epoch_start_offset, confirm_offset
        )

    def send_heartbeat(
        self, offset: int, epoch: int, epoch_start_offset: int, confirm_offset: int
    ) -> bytes:
        return self.send_transfer_header(offset, 0, epoch, epoch_start_offset, confirm_offset)


@attrs.define(eq=False)
class AutoSwitchSlaveProtocol:
    """The slave's side of one connection. It starts in HANDSHAKE: it encodes the handshake
    (``send_handshake``, repeated while no reply comes) and decodes the reply; the caller
    truncates its log to the point both agree on and calls ``start_transfer`` with its log
    end, which moves it to TRANSFER, where it decodes transfer frames and encodes acks.
    Compared by identity: it is one connection's live state."""

    #: this broker's controller brokerId
    broker_id: int
    sync_from_last_file: bool = False
    async_learner: bool = False
    max_frame_body: int = MAX_FRAME_BODY
    _state: HAState = HAState.HANDSHAKE
    _reply: HandshakeReply | None = None
    #: the slave's log end, where the next frame must start (0: empty, takes any start)
    _expected: int = 0
    _buffer: bytearray = attrs.field(factory=bytearray)
    _frame: TransferHeader | None = None
    _remaining: int = 0
    _label: tuple[int, int] = (-1, -1)

    def __attrs_post_init__(self) -> None:
        if not 0 <= self.broker_id <= INT64_MAX:
            raise ValueError(f"brokerId {self.broker_id} is out of range")

    @property
    def state(self) -> HAState:
        return self._state

    @property
    def expected(self) -> int:
        """The slave's log end as this connection knows it."""
        return self._expected

    @property
    def epoch(self) -> int:
        """The epoch of the last frame (-1: none yet)."""
        return self._label[0]

    @property
    def body_remaining(self) -> int:
        """Bytes of the current frame's body still to come (0 between frames)."""
        return max(0, self._remaining - len(self._buffer)) if self._frame else 0

    @property
    def bytes_wanted(self) -> int:
        """How much to read next so that nothing is read ahead: the rest of the current body
        (which the adapter may receive straight into the log), else the rest of a header."""
        if self._frame is not None:
            return max(1, self.body_remaining)
        buffer = self._buffer
        if self._state is HAState.TRANSFER:
            return max(1, TRANSFER_HEADER.size - len(buffer))
        want = HANDSHAKE_REPLY_HEADER.size
        if len(buffer) >= want:
            # The reply's body: next_event refuses a size out of range before it reads it.
            (size,) = _STATE.unpack_from(buffer, _STATE.size)
            want += max(0, min(size, EPOCH_ENTRY.size * MAX_EPOCH_ENTRIES))
        return max(1, want - len(buffer))

    def send_handshake(self) -> bytes:
        if self._state is not HAState.HANDSHAKE:
            raise RuntimeError("handshake after the transfer began")
        return HANDSHAKE.pack(
            HAState.HANDSHAKE, self.sync_from_last_file, self.async_learner, self.broker_id
        )

    def start_transfer(self, log_end: int) -> None:
        """The caller truncated (or did not need to) and its log ends at ``log_end``:
        frames must continue there (anywhere if 0, as RocketMQ's empty slave)."""
        if self._reply is None or self._state is not HAState.HANDSHAKE:
            raise RuntimeError("start_transfer without a handshake reply")
        if not 0 <= log_end <= INT64_MAX:
            raise ValueError(f"log end {log_end} is out of range")
        self._expected = log_end
        self._state = HAState.TRANSFER

    def send_ack(self, offset: int) -> bytes:
        if self._state is not HAState.TRANSFER:
            raise RuntimeError("ack before the transfer began")
        if not 0 <= offset <= INT64_MAX:
            raise ValueError(f"offset {offset} is out of range")
        return ACK.pack(HAState.TRANSFER, offset)

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        self._buffer += data

    def body_received(self, n: int) -> None:
        """The adapter received ``n`` body bytes itself (straight into the log)."""
        if self._frame is None or self._buffer or not 0 < n <= self._remaining:
            raise RuntimeError("body_received without that much body outstanding")
        self._remaining -= n

    def next_event(self) -> HandshakeReply | TransferHeader | FrameData | FrameEnd | NeedData:
        if self._state is HAState.TRANSFER:
            return self._next_transfer()
        if self._reply is not None:
            return NEED_DATA  # the caller truncates first; what follows waits for it
        buffer = self._buffer
        if len(buffer) < HANDSHAKE_REPLY_HEADER.size:
            _check_state_early(buffer, HAState.HANDSHAKE)
            return NEED_DATA
        state, size, max_offset, last_epoch = HANDSHAKE_REPLY_HEADER.unpack_from(buffer)
        if state != HAState.HANDSHAKE:
            raise HAProtocolError(f"frame with state {state} where HANDSHAKE was expected")
        if not 0 <= size <= EPOCH_ENTRY.size * MAX_EPOCH_ENTRIES or size % EPOCH_ENTRY.size:
            raise HAProtocolError(f"handshake reply body of {size} bytes is not an epoch list")
        if max_offset < 0:
            raise HAProtocolError(f"master max offset {max_offset} is negative")
        if len(buffer) < HANDSHAKE_REPLY_HEADER.size + size:
            return NEED_DATA
        body = bytes(buffer[HANDSHAKE_REPLY_HEADER.size : HANDSHAKE_REPLY_HEADER.size + size])
        epochs = tuple(EpochStart(e, s) for e, s in EPOCH_ENTRY.iter_unpack(body))
        if (problem := _check_epochs(epochs, max_offset)) is not None:
            raise HAProtocolError(f"master's epoch list is broken: {problem}")
        # lastEpoch is read apart from the list, so an epoch appended in between can make it
        # newer than the list's last; never older.
        if last_epoch < (epochs[-1].epoch if epochs else -1):
            raise HAProtocolError(f"master's last epoch {last_epoch} is not its list's last")
        del buffer[: HANDSHAKE_REPLY_HEADER.size + size]
        self._reply = HandshakeReply(max_offset, last_epoch, epochs)
        return self._reply

    def _next_transfer(self) -> TransferHeader | FrameData | FrameEnd | NeedData:
        frame = self._frame
        if frame is not None:
            if self._buffer and self._remaining:
                n = min(len(self._buffer), self._remaining)
                data = bytes(self._buffer[:n])
                del self._buffer[:n]
                self._remaining -= n
                return FrameData(data)
            if self._remaining:
                return NEED_DATA
            self._frame = None
            self._expected = frame.offset + frame.size
            return FrameEnd(frame.offset, frame.size)
        if len(self._buffer) < TRANSFER_HEADER.size:
            _check_state_early(self._buffer, HAState.TRANSFER)
            return NEED_DATA
        state, size, offset, epoch, epoch_start, confirm = TRANSFER_HEADER.unpack_from(
            self._buffer
        )
        if state != HAState.TRANSFER:
            raise HAProtocolError(f"frame with state {state} where TRANSFER was expected")
        if not 0 <= size <= self.max_frame_body:
            raise HAProtocolError(f"frame body size {size} is out of range")
        # An empty RocketMQ master (no segment yet) heartbeats at offset -1: an empty slave
        # takes it as the heartbeat it is. Any other negative offset is a lie.
        empty_master = offset == -1 and size == 0 and self._expected == 0
        if not empty_master and not 0 <= offset <= INT64_MAX - size:
            raise HAProtocolError(f"frame offset {offset} is out of range")
        if self._expected and offset != self._expected:
            raise OffsetMismatch(self._expected, offset)
        if (problem := _label_error(self._label, epoch, epoch_start, offset, size)) is not None:
            raise HAProtocolError(f"frame at {offset}: {problem}")
        if confirm < -1:
            raise HAProtocolError(f"confirm offset {confirm} is out of range")
        del self._buffer[: TRANSFER_HEADER.size]
        new_epoch = epoch != self._label[0]
        self._label = (epoch, epoch_start)
        header = TransferHeader(offset, size, epoch, epoch_start, confirm, new_epoch)
        if size:
            self._frame = header
            self._remaining = size
        return header
