"""The load of a chaos run: producers and a consumer group, through the client library as
an application uses it, each step recorded in the history.

Producers send one message at a time at a bounded rate; each body starts with its own id
and the id is also the message's KEYS, so a message can be found in the store files and by
QUERY_MESSAGE. Whatever a send ends with (an answer, a client error, a timeout) is recorded
with when it started and ended. The consumer group reads the topic with ``messages()`` (its
offsets committed as it goes, reading from a slave while the master is down) and records
every message it is handed.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import trio

from ..client import Message, MQError, open_producer, open_pull_consumer
from .history import ConsumeEvent, History, SendEvent, body_id
from .plan import ChaosConfig

__all__ = ["consume", "produce"]

#: the filler after a body's id (so that records have a realistic size)
PAYLOAD = b"x" * 200


async def produce(namesrv: str, config: ChaosConfig, producer_no: int, history: History,
                  clock: Callable[[], float]) -> None:
    """Send until cancelled, at most ``config.rate`` a second."""
    interval = 1.0 / config.rate
    async with open_producer(namesrv, f"chaos_producer_{producer_no}",
                             send_msg_timeout=config.send_timeout) as producer:
        seq = 0
        while True:
            seq += 1
            send_id = f"p{producer_no}-{seq}"
            started = clock()
            event: SendEvent
            try:
                result = await producer.send(
                    Message(config.topic, send_id.encode() + b" " + PAYLOAD, keys=send_id))
            except MQError as exc:
                event = SendEvent(send_id, producer_no, started, clock(), None,
                                  error=f"{type(exc).__name__}: {exc}"[:300])
            except trio.Cancelled:
                # The run ended during the send: the broker may have stored it, so it is an
                # attempt the checker must know of (a consumer may read it).
                history.send(SendEvent(send_id, producer_no, started, clock(), None,
                                       error="Cancelled: the run ended during the send"))
                raise
            else:
                event = SendEvent(send_id, producer_no, started, clock(),
                                  result.send_status.name, offset_msg_id=result.offset_msg_id,
                                  queue_id=result.message_queue.queue_id,
                                  queue_offset=result.queue_offset)
            history.send(event)
            await trio.sleep(max(0.0, interval - (clock() - started)))


async def consume(namesrv: str, config: ChaosConfig, history: History,
                  clock: Callable[[], float]) -> None:
    """Read the topic as the chaos group until cancelled."""
    async with open_pull_consumer(namesrv, config.group) as consumer:
        stream = consumer.messages(config.topic, from_where="first", suspend_timeout=1.0,
                                   commit_interval=1.0)
        async with stream:
            async for message in stream:
                history.consume(ConsumeEvent(
                    body_id(message.body), clock(), message.queue_id, message.queue_offset,
                    message.commitlog_offset))


def monotonic_clock() -> Callable[[], float]:
    """Seconds since now."""
    start = time.monotonic()
    return lambda: round(time.monotonic() - start, 4)
