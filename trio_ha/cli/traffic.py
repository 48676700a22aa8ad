"""``trio-ha produce`` and ``trio-ha consume``: messages in and out of a running cluster from
the shell, for a smoke test, a demo or a quick look at a topic.

Both use the project's client library as an application would (a producer group, a consumer
group that commits its offsets, so ``admin consumer-progress`` shows the group's lag). On a
terminal a progress bar runs on stderr; stdout carries only results, so both pipe well:
``produce`` prints a summary (or JSON), ``consume`` one line per message (JSON lines with
``--json``).
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import trio
import typer

from ._app import app, client_options
from .admin import admin_app, json_option, message_row, namesrv_option, run_client


@contextlib.contextmanager
def progress_bar(description: str, total: int | None) -> Iterator[Any]:
    """A rich progress bar on stderr when it is a terminal; a no-op otherwise. Yields a
    function that advances it by n."""
    if not sys.stderr.isatty():
        yield lambda n=1: None
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task(description, total=total)
        yield lambda n=1: progress.advance(task, n)


def _counts(counter: Counter[str]) -> str:
    """``SEND_OK 57, FLUSH_DISK_TIMEOUT 2``: a count per status, for people."""
    return ", ".join(f"{name} {n}" for name, n in counter.most_common())


@app.command()
def produce(
    topic: str = typer.Option(..., "-t", "--topic", help="the topic"),
    count: int = typer.Option(1, "-c", "--count", min=1, max=100_000_000,
                              help="messages to send"),
    body: str = typer.Option(None, "-b", "--body",
                             help="the body (default: 'message #i' padded to --size)"),
    size: int = typer.Option(0, "--size", min=0, max=4 * 1024 * 1024,
                             help="pad generated bodies to this many bytes"),
    keys: str = typer.Option(None, "-k", "--keys", help="KEYS, space-separated"),
    tags: str = typer.Option(None, "--tags", help="the TAGS of every message"),
    group: str = typer.Option("trio-ha-cli-producer", "-g", "--group",
                               help="the producer group"),
    namesrv: str = namesrv_option(), as_json: bool = json_option(),
) -> None:
    """Send messages one by one and report every status; exit 1 if any was not SEND_OK."""
    from ..client import Message, MQError, open_producer

    # outside ``work``: a Ctrl-C'd run still says how many got an answer
    statuses: Counter[str] = Counter()
    failures: Counter[str] = Counter()

    async def work() -> dict[str, Any]:
        last: dict[str, Any] = {}
        started = time.perf_counter()
        async with open_producer(namesrv, group, **client_options()) as producer:
            with progress_bar(f"producing to {topic}", count) as advance:
                for i in range(count):
                    data = body.encode() if body is not None else f"message #{i}".encode()
                    if len(data) < size:
                        data = data.ljust(size, b".")
                    try:
                        result = await producer.send(Message(topic, data, tags=tags, keys=keys))
                    except MQError as exc:
                        failures[type(exc).__name__ + ": " + str(exc)[:200]] += 1
                        if not statuses:
                            break  # nothing got through: the cluster is not there at all
                    else:
                        statuses[result.send_status.name] += 1
                        last = {"msgId": result.msg_id, "offsetMsgId": result.offset_msg_id,
                                "brokerName": result.message_queue.broker_name,
                                "queueId": result.message_queue.queue_id,
                                "queueOffset": result.queue_offset}
                    advance()
        seconds = time.perf_counter() - started
        return {"topic": topic, "sent": sum(statuses.values()), "statuses": dict(statuses),
                "failures": dict(failures), "seconds": round(seconds, 3),
                "rate": round(sum(statuses.values()) / seconds, 1) if seconds > 0 else None,
                "last": last}

    def interrupted() -> str:
        return (f"{sum(statuses.values())} of {count} messages acknowledged by the broker "
                f"({_counts(statuses) or 'none'}), {sum(failures.values())} failed")

    report = run_client(work, interrupted)
    if as_json:
        print(json.dumps(report))
    else:
        print(f"sent {report['sent']} to {topic} in {report['seconds']} s "
              f"({report['rate']}/s): {report['statuses']}")
        if report["last"]:
            last = report["last"]
            print(f"last: msgId {last['msgId']} offsetMsgId {last['offsetMsgId']} on "
                  f"{last['brokerName']}/{last['queueId']} at {last['queueOffset']}")
        for failure, n in report["failures"].items():
            print(f"failed {n}x: {failure}", file=sys.stderr)
    if report["failures"] or set(report["statuses"]) - {"SEND_OK"}:
        raise typer.Exit(1)


@app.command()
def consume(
    topic: str = typer.Option(..., "-t", "--topic", help="the topic"),
    group: str = typer.Option(..., "-g", "--group",
                               help="the consumer group (its offsets are committed)"),
    count: int = typer.Option(0, "-c", "--count", min=0,
                              help="stop after this many messages (0: no limit)"),
    idle_seconds: float = typer.Option(5.0, "--idle-seconds", min=0.1,
                                       help="stop when nothing arrives for this long"),
    from_where: str = typer.Option("first", "--from", help="where a group without an offset "
                                                           "starts: first or last"),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="count, do not print, messages"),
    namesrv: str = namesrv_option(), as_json: bool = json_option(),
) -> None:
    """Read a topic as a consumer group (its share of the queues, offsets committed), one
    line per message, until --count messages or --idle-seconds without one."""
    from ..client import MessageStream, open_pull_consumer

    if from_where not in ("first", "last"):
        raise typer.BadParameter("--from must be first or last")

    received = 0  # outside ``work``: a Ctrl-C'd run still says how many it consumed
    # what a Ctrl-C cuts short: the loop, not the consumer, whose connections must still
    # carry the commit of what was consumed when the stream closes
    stop = trio.CancelScope()

    async def work() -> None:
        async with open_pull_consumer(namesrv, group, **client_options()) as consumer:
            stream = consumer.messages(topic, from_where=from_where, suspend_timeout=1.0,
                                       commit_interval=1.0)
            with progress_bar(f"consuming {topic}", count or None) as advance:
                async with stream:
                    with stop:
                        await read(stream, advance)

    async def read(stream: MessageStream, advance: Callable[..., None]) -> None:
        nonlocal received
        while not count or received < count:
            message = None
            with trio.move_on_after(idle_seconds):
                message = await stream.__anext__()
            if message is None:
                break  # idle for idle_seconds
            received += 1
            advance()
            if quiet:
                continue
            if as_json:
                print(json.dumps(message_row(message)), flush=True)
            else:
                print(f"{message.queue_id}:{message.queue_offset} "
                      f"{message.msg_id} keys={' '.join(message.keys)} "
                      f"tags={message.tags} "
                      f"{message.body.decode('utf-8', 'replace')[:200]}", flush=True)

    run_client(work, lambda: f"consumed {received} messages of {topic} as {group}", stop=stop)
    print(f"consumed {received} messages of {topic} as {group}", file=sys.stderr)


@admin_app.command("send-message")
def send_message(
    topic: str = typer.Option(..., "-t", "--topic", help="the topic"),
    body: str = typer.Option(..., "-p", "--body", help="the body"),
    keys: str = typer.Option(None, "-k", "--keys", help="KEYS, space-separated"),
    tags: str = typer.Option(None, "-c", "--tags", help="the TAGS"),
    namesrv: str = namesrv_option(), as_json: bool = json_option(),
) -> None:
    """mqadmin sendMessage: one message (``trio-ha produce`` sends many)."""
    produce(topic=topic, count=1, body=body, size=0, keys=keys, tags=tags,
            group="trio-ha-cli-producer", namesrv=namesrv, as_json=as_json)


admin_app.command("sendMessage", hidden=True)(send_message)
