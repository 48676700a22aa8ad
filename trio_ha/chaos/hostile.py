"""The attacks of the hardening issue (issue 9) as reusable functions against given addresses.

Why a module and not only tests: each attack was first written inline in a test against an
in-process server, where the test can also look inside (what the server buffered, why it
closed a connection). ``trio-ha chaos hostile`` makes the same attacks on a real cluster in
child processes, where only what a peer sees counts — did the node answer, did it close the
connection, is it still up. So the attack is here, once, against an address; the tests call
it and keep their inside checks; the command calls it and reports what the peer saw.

Every attack is bounded in count and time (``seconds``: it returns by then whatever the node
does), opens its own connections and closes them before it returns, and reports an
``AttackOutcome``: what was sent, how many connections the node closed or refused, what it
answered. The outcome does not judge: a node's limits decide what it closes and when (a
name server with a 30 s request timeout does not close a slowloris peer within a 5 s attack,
and that is fine); the caller checks what matters to it.

The attacks, by the port they reach:

* remoting (a broker's or a name server's): clients that never read their replies
  (``non_reading_clients``), frames declared large and sent in part (``partial_frames``), a
  frame a byte at a time (``slowloris``), long-polled pulls whose client goes away
  (``abandon_long_polls``), frames that are not frames (``bad_frames``), more connections than
  the node serves (``connection_flood``), requests a broker must refuse (``invalid_input``) and
  a flood of groups, topics and offsets that do not exist (``metadata_flood``);
* a master's HA port: a flood of reports (``ha_report_flood``), peers that lie
  (``rogue_slave``: garbage, torn reports, acks beyond the log or backwards, a request beyond
  the log, the log end presented on a fresh connection), and ``connection_flood`` again;
* a slave's HA client: ``RogueHAMaster``, a listener that plays master to a slave pointed at
  it, with scripts such as ``start_at`` (a first frame where no log can begin).
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import socket
import struct
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping

import attrs
import trio

from ..remoting import RemotingClient, RemotingError, open_remoting_client
from ..wire.errors import RemotingDecodeError
from ..wire.ha import FRAME_HEADER, REPORT
from ..wire.metadata import decode_consumer_offsets, offset_key
from ..wire.permission import Permission
from ..wire.record import parse_host_port
from ..wire.remoting import (
    NEED_DATA,
    FrameDecoder,
    JavaValue,
    PullSysFlag,
    RemotingCommand,
    RequestCode,
    ResponseCode,
    encode,
)
from ..wire.route import ClusterInfo

__all__ = [
    "BAD_GROUP", "BAD_TOPIC", "LONG_TOPIC", "AttackOutcome", "NodeAnswer", "PresentedEnd",
    "RogueHAMaster", "abandon_long_polls", "ask_beyond_the_log", "bad_frames",
    "close_quietly", "closed_by_node", "commit_request", "connect_raw", "connection_flood",
    "create_topic_request", "ha_report_flood", "heartbeat_request", "invalid_input",
    "invalid_requests", "metadata_flood", "node_has_closed", "non_reading_clients",
    "open_ha_peer", "partial_frames", "present_log_end", "pull_request", "read_until_closed",
    "receive_exactly", "request_frames", "rogue_slave", "send_request", "send_until_closed",
    "slowloris", "start_at", "stream_reports",
    # issue 35
    "broker_name_takeover",
    # issue 35, the broker's part
    "group_flood", "lock_hoarding", "lock_request", "subscription_group_request",
    # ACL
    "replay_signatures", "replayed_as",
    # HA slots (issue 35)
    "ha_slot_squatters",
]

#: a 250-character group name ending in "/" (issue 9, point 11)
BAD_GROUP = "g" * 249 + "/"
BAD_TOPIC = "../etc"
LONG_TOPIC = "t" * 300
#: a frame whose header is not JSON: the node must close the connection
BAD_JSON_FRAME = struct.pack(">ii", 12, 8) + b"{not jso"
#: how long a connect may take before it counts as refused
CONNECT_TIMEOUT = 5.0
#: how often an attack looks whether the node closed a connection it does not read
POLL_INTERVAL = 0.05
_SEND_SLICE = 64 * 1024
#: Linux's tcp_info state of an open connection (any other: the node closed or reset it)
_TCP_ESTABLISHED = 1


# ---- outcomes --------------------------------------------------------------------------------


def sorted_counts(value: Mapping[str, int]) -> dict[str, int]:
    """A tally as a dict in key order (the outcomes' converter: reports read the same)."""
    return dict(sorted(value.items()))


@attrs.frozen
class AttackOutcome:
    """What one attack sent and how the node answered, as a peer sees it."""

    attack: str
    target: str
    #: connections the attack opened (connect attempts that failed are in ``refused`` too)
    connections: int = 0
    #: frames (requests, reports) and bytes that went out whole
    frames_sent: int = 0
    bytes_sent: int = 0
    #: connections the node closed (EOF or reset) while the attack ran
    closed_by_node: int = 0
    #: connections the node closed at once, or never accepted (connection limits)
    refused: int = 0
    #: the node's answers, by what they were (response code names, "heartbeat"...)
    answers: Mapping[str, int] = attrs.field(factory=dict, converter=sorted_counts)
    seconds: float = 0.0
    note: str = ""

    def as_json(self) -> dict[str, object]:
        return attrs.asdict(self)


@attrs.define
class _Tally:
    """What an attack counts while it runs; frozen into an AttackOutcome at the end."""

    attack: str
    target: str
    started: float = attrs.field(factory=time.monotonic)
    connections: int = 0
    frames_sent: int = 0
    bytes_sent: int = 0
    closed_by_node: int = 0
    refused: int = 0
    answers: Counter[str] = attrs.field(factory=Counter)
    note: str = ""

    async def connect(self, address: str, *, receive_buffer: int | None = None
                      ) -> trio.SocketStream | None:
        """A connection to ``address``, counted; None when the node refused it (counted too)."""
        try:
            stream = await connect_raw(address, receive_buffer=receive_buffer)
        except OSError:
            self.refused += 1
            return None
        self.connections += 1
        return stream

    def outcome(self) -> AttackOutcome:
        return AttackOutcome(
            self.attack, self.target, self.connections, self.frames_sent, self.bytes_sent,
            self.closed_by_node, self.refused, dict(self.answers),
            round(time.monotonic() - self.started, 3), self.note,
        )


def code_name(code: int) -> str:
    try:
        return ResponseCode(code).name
    except ValueError:
        return str(code)


# ---- raw connections -------------------------------------------------------------------------


def split_address(address: str) -> tuple[str, int]:
    return parse_host_port(address)


async def connect_raw(address: str, *, receive_buffer: int | None = None) -> trio.SocketStream:
    """A TCP connection to ``address`` (``host:port``). ``receive_buffer`` (SO_RCVBUF, set
    before connecting: the window is settled in the handshake) makes a peer that reads
    slowly, or not at all, fill up at once. Raises OSError (TimeoutError after
    CONNECT_TIMEOUT) when the node does not take the connection."""
    host, port = split_address(address)
    sock = trio.socket.socket()
    try:
        if receive_buffer is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        with trio.move_on_after(CONNECT_TIMEOUT):
            await sock.connect((host, port))
            return trio.SocketStream(sock)
    except BaseException:
        sock.close()
        raise
    sock.close()
    raise TimeoutError(f"connecting to {address} took more than {CONNECT_TIMEOUT:g} s")


async def close_quietly(stream: trio.abc.AsyncResource) -> None:
    with trio.CancelScope(shield=True):
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            await stream.aclose()


async def send_until_closed(stream: trio.SocketStream, data: bytes | memoryview) -> bool:
    """Send as an attacker does: True once all of ``data`` went out, False if the node
    closed the connection first."""
    try:
        await stream.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return False
    return True


def node_has_closed(stream: trio.SocketStream) -> bool:
    """Whether the node has closed (or reset) the connection, without reading from it: for a
    peer that must not read (its unread replies are the attack). Linux's TCP_INFO state."""
    try:
        info = stream.socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)
    except OSError:
        return True
    return info[0] != _TCP_ESTABLISHED


async def closed_by_node(stream: trio.SocketStream, timeout: float) -> bool:
    """Read (and drop) whatever the node sends until it closes the connection: True if it
    did (EOF or reset) within ``timeout`` seconds."""
    with trio.move_on_after(max(0.0, timeout)):
        try:
            while await stream.receive_some(65536):
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        return True
    return False


@attrs.frozen
class NodeAnswer:
    """What a node sent on a connection, and whether it closed it."""

    data: bytes
    closed: bool


async def read_until_closed(stream: trio.SocketStream, timeout: float) -> NodeAnswer:
    """Everything the node sends until it closes the connection or ``timeout`` passes."""
    received = bytearray()
    with trio.move_on_after(max(0.0, timeout)):
        try:
            while data := await stream.receive_some(65536):
                received += data
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        return NodeAnswer(bytes(received), True)
    return NodeAnswer(bytes(received), False)


async def receive_exactly(stream: trio.SocketStream, n: int, timeout: float) -> bytes:
    """``n`` bytes, or fewer if the node closed the connection or ``timeout`` passed."""
    data = bytearray()
    with trio.move_on_after(max(0.0, timeout)):
        while len(data) < n:
            try:
                chunk = await stream.receive_some(n - len(data))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                break
            if not chunk:
                break
            data += chunk
    return bytes(data)


async def _watch_answers(stream: trio.SocketStream, tally: _Tally) -> bool:
    """Decode the node's answers into ``tally`` until the node closes the connection (True)
    or the caller cancels; a stream that stops being frames ends the watch (False)."""
    decoder = FrameDecoder()
    try:
        while data := await stream.receive_some(65536):
            decoder.receive_data(data)
            while (command := decoder.next_command()) is not NEED_DATA:
                tally.answers[code_name(command.code)] += 1
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    except RemotingDecodeError:
        tally.answers["undecodable"] += 1
        return False
    return True


# ---- requests --------------------------------------------------------------------------------


def request_frames(code: int, count: int, **fields: JavaValue) -> bytes:
    """``count`` requests of ``code`` with the custom header ``fields``, as one byte string
    (pipelined: opaque 1, 2, ...)."""
    return b"".join(encode(RemotingCommand.request(code, fields, opaque=i + 1))
                    for i in range(count))


def send_request(topic: str, body: bytes = b"x", *, queue: int = 0,
                 code: int = RequestCode.SEND_MESSAGE_V2, default: str = "TBW102",
                 queue_nums: int = 4, group: str = "pg") -> RemotingCommand:
    fields = {"producerGroup": group, "topic": topic, "defaultTopic": default,
              "defaultTopicQueueNums": queue_nums, "queueId": queue, "sysFlag": 0,
              "bornTimestamp": 1, "flag": 0}
    if code != RequestCode.SEND_MESSAGE:  # V2 and batches: the same fields, one letter each
        fields = dict(zip("abcdefgh", fields.values(), strict=True))
    return RemotingCommand.request(code, fields, body=body)


def pull_request(topic: str = "T", *, group: str = "cg", queue: int = 0, offset: int = 0,
                 commit: int | None = None, suspend_millis: int = 0) -> RemotingCommand:
    flags = PullSysFlag.COMMIT_OFFSET if commit is not None else PullSysFlag(0)
    if suspend_millis:
        flags |= PullSysFlag.SUSPEND
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, {
        "consumerGroup": group, "topic": topic, "queueId": queue, "queueOffset": offset,
        "maxMsgNums": 32, "sysFlag": int(flags), "commitOffset": commit or 0,
        "suspendTimeoutMillis": suspend_millis, "subVersion": 0,
    })


def commit_request(group: str, topic: str, queue: int = 0, offset: int = 1) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, {
        "consumerGroup": group, "topic": topic, "queueId": queue, "commitOffset": offset,
    })


def heartbeat_request(client_id: str, *, consumers: tuple[str, ...] | list[str] = (),
                      producers: tuple[str, ...] | list[str] = (),
                      topic: str = "T") -> RemotingCommand:
    return RemotingCommand.request(RequestCode.HEART_BEAT, body=json.dumps({
        "clientID": client_id,
        "consumerDataSet": [{
            "groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
            "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "unitMode": False,
            "subscriptionDataSet": [{"topic": topic, "subString": "*", "tagsSet": [],
                                     "codeSet": [], "subVersion": 0, "classFilterMode": False}],
        } for group in consumers],
        "producerDataSet": [{"groupName": group} for group in producers],
    }).encode())


def create_topic_request(topic: str, queues: int = 4,
                         perm: int = Permission.READ | Permission.WRITE) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
        "topic": topic, "readQueueNums": queues, "writeQueueNums": queues, "perm": int(perm),
    })


def invalid_requests() -> dict[str, RemotingCommand]:
    """One request per broker handler path that takes a name or a number from the client,
    each with a value the broker must refuse (issue 9, point 11)."""
    consumer = {"groupName": BAD_GROUP, "consumeType": "CONSUME_PASSIVELY",
                "messageModel": "CLUSTERING", "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
                "subscriptionDataSet": [], "unitMode": False}
    return {
        "pull with a bad group": pull_request(group=BAD_GROUP),
        "pull committing for a bad group": pull_request(group=BAD_GROUP, commit=5),
        "heartbeat with a bad consumer group": RemotingCommand.request(
            RequestCode.HEART_BEAT, body=json.dumps(
                {"clientID": "c", "consumerDataSet": [consumer], "producerDataSet": []}
            ).encode()),
        "heartbeat with a bad producer group": heartbeat_request("c", producers=[BAD_GROUP]),
        "commit for a bad group": commit_request(BAD_GROUP, "T"),
        "commit for a bad topic": commit_request("cg", BAD_TOPIC),
        "commit to a negative queue": commit_request("cg", "T", queue=-1),
        "commit of a negative offset": commit_request("cg", "T", offset=-1),
        "commit to a queue the topic does not have": commit_request("cg", "T", queue=2**31 - 1),
        "send to a bad topic": send_request(BAD_TOPIC),
        "send to a too long topic": send_request(LONG_TOPIC),
        "send to a blank topic": send_request(""),
        "subscription group with a bad name": RemotingCommand.request(
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
            body=json.dumps({"groupName": BAD_GROUP}).encode()),
        "subscription group body that is not an object": RemotingCommand.request(
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=b"[]"),
        "topic with a bad name": create_topic_request(BAD_GROUP),
        "topic with too many queues": create_topic_request("Ok", 2**31 - 1),
        "topic with a bad filter type": RemotingCommand.request(
            RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "Ok", "readQueueNums": 4,
                                                  "writeQueueNums": 4,
                                                  "topicFilterType": "x\n" * 200}),
        "consumer list of a bad group": RemotingCommand.request(
            RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": BAD_GROUP}),
    }


def is_one_short_line(remark: str | None, limit: int = 300) -> bool:
    """A refusal's remark as the broker must write it: one line, not a traceback."""
    return remark is not None and "\n" not in remark and len(remark) <= limit


# ---- remoting attacks ------------------------------------------------------------------------


async def _send_slices(stream: trio.SocketStream, data: bytes, tally: _Tally) -> bool:
    """Send ``data`` in slices (views, not copies), counting the bytes that went out; False
    if the node closed the connection first."""
    with memoryview(data) as view:
        for start in range(0, len(view), _SEND_SLICE):
            piece = view[start:start + _SEND_SLICE]
            if not await send_until_closed(stream, piece):
                return False
            tally.bytes_sent += len(piece)
    return True


async def _send_filler(stream: trio.SocketStream, size: int, tally: _Tally) -> bool:
    """Send ``size`` bytes of filler, one shared slice at a time (an attacker's bytes cost it
    nothing: here they cost the attacking process no memory either)."""
    filler = b"x" * _SEND_SLICE
    sent = 0
    while sent < size:
        n = min(_SEND_SLICE, size - sent)
        if not await send_until_closed(stream, filler if n == _SEND_SLICE else filler[:n]):
            return False
        sent += n
        tally.bytes_sent += n
    return True


async def _wait_closed_without_reading(stream: trio.SocketStream, deadline: float) -> bool:
    """Whether the node closed the connection by ``deadline``, looking without reading (no
    event tells: the kernel's state of the socket is all there is)."""
    with trio.move_on_at(deadline):
        while True:
            if node_has_closed(stream):
                return True
            await trio.sleep(POLL_INTERVAL)
    return False


async def non_reading_clients(address: str, requests: bytes, *, clients: int = 1,
                              receive_buffer: int = 4096, seconds: float = 15.0,
                              frames: int = 0) -> AttackOutcome:
    """``clients`` connections that pipeline ``requests`` (``frames`` of them, for the
    count) and never read a reply: the node must stop reading them (back-pressure) and close
    them once its writes make no progress. Returns once the node closed them all, or after
    ``seconds``."""
    tally = _Tally("non-reading clients", address)
    deadline = trio.current_time() + seconds

    async def one() -> None:
        stream = await tally.connect(address, receive_buffer=receive_buffer)
        if stream is None:
            return
        try:
            async with trio.open_nursery() as nursery:
                async def send() -> None:
                    if await _send_slices(stream, requests, tally):
                        tally.frames_sent += frames

                nursery.start_soon(send)
                if await _wait_closed_without_reading(stream, deadline):
                    tally.closed_by_node += 1
                nursery.cancel_scope.cancel()
        finally:
            await close_quietly(stream)

    async with trio.open_nursery() as nursery:
        for _ in range(clients):
            nursery.start_soon(one)
    return tally.outcome()


async def partial_frames(address: str, *, connections: int = 6, declared: int = 4 * 1024 * 1024,
                         sent: int = 2 * 1024 * 1024, seconds: float = 15.0) -> AttackOutcome:
    """``connections`` peers each send ``sent`` bytes of a frame declared ``declared`` bytes
    long, and no more: the node must bound what it buffers for them and close them when the
    frame has not arrived within its request timeout."""
    tally = _Tally("partial frames", address)
    header = b'{"code":1,"flag":0} '
    head = struct.pack(">ii", declared, len(header)) + header
    deadline = trio.current_time() + seconds

    async def send(stream: trio.SocketStream) -> None:
        if await send_until_closed(stream, head):
            tally.bytes_sent += len(head)
            await _send_filler(stream, max(0, sent - len(head)), tally)

    async def one() -> None:
        stream = await tally.connect(address)
        if stream is None:
            return
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(send, stream)
                if await closed_by_node(stream, deadline - trio.current_time()):
                    tally.closed_by_node += 1
                nursery.cancel_scope.cancel()
        finally:
            await close_quietly(stream)

    async with trio.open_nursery() as nursery:
        for _ in range(connections):
            nursery.start_soon(one)
    return tally.outcome()


async def slowloris(address: str, frame: bytes, *, interval: float = 0.05,
                    seconds: float = 10.0) -> AttackOutcome:
    """One byte of ``frame`` every ``interval`` seconds, so the connection is never idle:
    the node must close it when the frame has not arrived within its request timeout (an
    answer means the whole frame arrived first)."""
    tally = _Tally("slowloris", address)
    deadline = trio.current_time() + seconds
    stream = await tally.connect(address)
    if stream is None:
        return tally.outcome()
    try:
        async with trio.open_nursery() as nursery:
            async def drip() -> None:
                for i in range(len(frame)):
                    if not await send_until_closed(stream, frame[i:i + 1]):
                        return
                    tally.bytes_sent += 1
                    await trio.sleep(interval)
                tally.frames_sent += 1

            nursery.start_soon(drip)
            with trio.move_on_at(deadline):
                if await _watch_answers(stream, tally):
                    tally.closed_by_node += 1
            nursery.cancel_scope.cancel()
    finally:
        await close_quietly(stream)
    return tally.outcome()


async def abandon_long_polls(address: str, requests: bytes, *, hold_seconds: float,
                             frames: int = 0, leave: trio.Event | None = None) -> AttackOutcome:
    """Send requests the node holds (long-polled pulls), wait ``hold_seconds`` (or until
    ``leave`` is set, if sooner), and go away: the node must cancel them rather than keep
    them until their own timeout. ``answers`` counts what was answered before the peer left
    (held requests are not)."""
    tally = _Tally("abandoned long polls", address)
    stream = await tally.connect(address)
    if stream is None:
        return tally.outcome()
    try:
        if await _send_slices(stream, requests, tally):
            tally.frames_sent += frames
        with trio.move_on_after(hold_seconds):
            async with trio.open_nursery() as holding:

                async def watch() -> None:
                    if await _watch_answers(stream, tally):
                        tally.closed_by_node += 1
                    holding.cancel_scope.cancel()

                holding.start_soon(watch)
                if leave is not None:
                    await leave.wait()
                    holding.cancel_scope.cancel()
    finally:
        await close_quietly(stream)
    return tally.outcome()


async def bad_frames(address: str, *, connections: int = 50, frame: bytes = BAD_JSON_FRAME,
                     seconds: float = 10.0) -> AttackOutcome:
    """``connections`` connections, one after another, each sending ``frame`` (by default a
    header that is not JSON): the node must close each."""
    tally = _Tally("bad frames", address)
    deadline = trio.current_time() + seconds
    await trio.lowlevel.checkpoint()
    for _ in range(connections):
        if trio.current_time() >= deadline:
            break
        stream = await tally.connect(address)
        if stream is None:
            continue
        try:
            if await send_until_closed(stream, frame):
                tally.frames_sent += 1
                tally.bytes_sent += len(frame)
            if await closed_by_node(stream, max(0.0, deadline - trio.current_time())):
                tally.closed_by_node += 1
        finally:
            await close_quietly(stream)
    return tally.outcome()


async def connection_flood(address: str, *, connections: int = 1000, hold_seconds: float = 1.0,
                           seconds: float = 30.0, attack: str = "connection flood"
                           ) -> AttackOutcome:
    """Open ``connections`` connections and hold them ``hold_seconds``: the node must close
    those beyond what it serves at once (``refused``) rather than leave them unanswered, and
    keep serving. All are closed before it returns."""
    tally = _Tally(attack, address)
    deadline = trio.current_time() + seconds
    streams: list[trio.SocketStream] = []
    try:
        for _ in range(connections):
            if trio.current_time() >= deadline:
                break
            try:
                streams.append(await connect_raw(address))
            except OSError:
                tally.refused += 1
        tally.connections = len(streams)
        await trio.sleep(min(hold_seconds, max(0.0, deadline - trio.current_time())))
        closed = sum(node_has_closed(stream) for stream in streams)
        tally.refused += closed
        tally.closed_by_node = closed
    finally:
        for stream in streams:
            await close_quietly(stream)
    return tally.outcome()


async def invalid_input(address: str, *, rounds: int = 1, seconds: float = 30.0) -> AttackOutcome:
    """Every request of ``invalid_requests`` ``rounds`` times, over one connection: each must
    be refused with a one-line answer. ``answers`` counts them by response code;
    ``note`` names any that were not refused, or refused with more than one short line."""
    tally = _Tally("invalid input", address)
    odd: set[str] = set()
    with trio.move_on_after(seconds):
        async with open_remoting_client(address) as client:
            tally.connections += 1
            for _ in range(rounds):
                for name, request in invalid_requests().items():
                    try:
                        reply = await client.invoke(request, 5)
                    except RemotingError:
                        tally.answers["no answer"] += 1
                        continue
                    tally.frames_sent += 1
                    tally.answers[code_name(reply.code)] += 1
                    if reply.code == ResponseCode.SUCCESS or not is_one_short_line(reply.remark):
                        odd.add(name)
    tally.note = "; ".join(sorted(odd))
    return tally.outcome()


async def metadata_flood(address: str, *, heartbeats: int = 200, pulls: int = 300,
                         seconds: float = 60.0, prefix: str = "flood") -> AttackOutcome:
    """Heartbeats naming new consumer and producer groups (three of each per heartbeat),
    pulls for new groups, and commits for new groups on topics that do not exist: the
    broker's tables must stay within their caps. ``answers`` counts replies as
    ``<request>:<response code>``; ``note`` counts remarks that were not one short line."""
    tally = _Tally("metadata flood", address)
    long_remarks = 0

    def count(kind: str, reply: RemotingCommand) -> None:
        nonlocal long_remarks
        tally.frames_sent += 1
        tally.answers[f"{kind}:{code_name(reply.code)}"] += 1
        if reply.code != ResponseCode.SUCCESS and not is_one_short_line(reply.remark):
            long_remarks += 1

    with trio.move_on_after(seconds):
        async with open_remoting_client(address) as client:
            tally.connections += 1
            for i in range(heartbeats):
                names = [f"{prefix}{i}_{j}" for j in range(3)]
                count("HEART_BEAT", await client.invoke(
                    heartbeat_request(f"{prefix}-client{i}", consumers=names, producers=names),
                    5))
            for i in range(pulls):
                count("PULL_MESSAGE", await client.invoke(
                    pull_request(group=f"{prefix}puller{i}"), 5))
                count("UPDATE_CONSUMER_OFFSET", await client.invoke(
                    commit_request(f"{prefix}{i}_0", f"{prefix}NoSuchTopic{i}"), 5))
    tally.note = f"{long_remarks} refusals not one short line" if long_remarks else ""
    return tally.outcome()


# ---- attacks on a master's HA port -----------------------------------------------------------

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


async def _drain(stream: trio.SocketStream, limit: int, tally: _Tally | None = None) -> bool:
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
    tally = _Tally("HA report flood", ha_address)
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
    tally = _Tally("rogue HA slave", ha_address)
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


# ---- a rogue master, for a slave pointed at it -----------------------------------------------

#: What a rogue master does with one session: it gets the connection and the session's
#: number (from 0); the slave's first report has not been read yet.
Script = Callable[[trio.SocketStream, int], Awaitable[None]]


def start_at(offset: int, size: int = 100) -> Script:
    """A script that answers the slave's first report with one data frame of ``size`` bytes
    at ``offset``, then waits for the slave to leave."""

    async def script(stream: trio.SocketStream, session: int) -> None:
        await receive_exactly(stream, REPORT.size, CONNECT_TIMEOUT)
        if await send_until_closed(stream, FRAME.pack(offset, size) + b"x" * size):
            await closed_by_node(stream, float("inf"))

    return script


@attrs.define(eq=False)
class RogueHAMaster:
    """A listener that plays master to the slaves that connect to it: each connection (a
    session) runs ``script``, which may be replaced between sessions. Counts the sessions
    and those the slave ended (closed while the script waited on it)."""

    script: Script
    sessions: int = 0
    ended_by_slave: int = 0
    address: str | None = None

    async def serve(self, *, listeners: list[trio.SocketListener] | None = None,
                    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve on ``listeners`` (by default a new one on 127.0.0.1, port 0) until
        cancelled; reports ``host:port``."""
        if listeners is None:
            listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        host, port = listeners[0].socket.getsockname()[:2]
        self.address = f"{host}:{port}"
        task_status.started(self.address)
        await trio.serve_listeners(self._session, listeners)

    async def _session(self, stream: trio.SocketStream) -> None:
        number = self.sessions
        self.sessions += 1
        async with stream:
            try:
                await self.script(stream, number)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self.ended_by_slave += 1
            else:
                if node_has_closed(stream):
                    self.ended_by_slave += 1


# ---- connections a node no longer reads, and the metrics endpoint (issue 35) ----------------

__all__ += ["crowd_the_metrics", "leave_with_requests_unsent", "scrape_status"]

#: the send buffer of a client that leaves with requests unsent: small, so that the node's
#: full receive window leaves bytes — and the FIN behind them — in the client's send queue
_UNSENT_SEND_BUFFER = 64 * 1024


async def leave_with_requests_unsent(address: str, requests: bytes, *, seconds: float,
                                     stall: float = 0.5, max_bytes: int = 64 * 1024 * 1024
                                     ) -> AttackOutcome:
    """Send ``requests`` (held ones: long-polled pulls) again and again until the node stops
    reading — its in-flight limit is full, its receive window shut — and no send progresses
    for ``stall`` seconds (or ``max_bytes`` went out), then hang up (shutdown for writing).
    The FIN waits in this side's send queue behind the requests the node will not take, so
    the node never sees it; its connection is ESTABLISHED, with unread bytes, held requests
    and their memory. The node must still let it go — by its idle timeout at the latest
    (``serverChannelMaxIdleTimeSeconds``): ``closed_by_node`` is 1 if it did (a reset, as it
    closes with our requests unread) within ``seconds``."""
    tally = _Tally("leave with requests unsent", address)
    deadline = trio.current_time() + seconds
    stream = await tally.connect(address)
    if stream is None:
        return tally.outcome()
    try:
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _UNSENT_SEND_BUFFER)
        view = memoryview(requests)
        stalled = False
        while not stalled and tally.bytes_sent < max_bytes:  # bounded by max_bytes
            for start in range(0, len(view), _SEND_SLICE):
                piece = view[start:start + _SEND_SLICE]
                with trio.move_on_after(stall):
                    if not await send_until_closed(stream, piece):
                        tally.closed_by_node += 1
                        tally.note = "closed by the node while it was still reading"
                        return tally.outcome()
                    tally.bytes_sent += len(piece)
                    continue
                stalled = True  # (a part of this piece may have gone: not counted)
                break
            else:
                tally.frames_sent += 1  # one batch of ``requests`` went out whole
        if not stalled:
            tally.note = f"the node read all {tally.bytes_sent} bytes: it never stopped reading"
        with contextlib.suppress(OSError):
            stream.socket.shutdown(socket.SHUT_WR)  # the FIN, queued behind the unsent bytes
        if await closed_by_node(stream, deadline - trio.current_time()):
            tally.closed_by_node += 1
        elif not tally.note:
            tally.note = "still open at the attack's bound (the node's idle timeout is longer)"
    finally:
        await close_quietly(stream)
    return tally.outcome()


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
    tally = _Tally(attack, address)
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


# ---- a broker name's takeover at the name server (issue 35) ----------------------------------


async def _master_of(client: RemotingClient, broker_name: str) -> str | None:
    reply = await client.invoke(RemotingCommand.request(
        RequestCode.GET_BROKER_CLUSTER_INFO, {}), CONNECT_TIMEOUT)
    if reply.code != ResponseCode.SUCCESS:
        return None
    data = ClusterInfo.decode(reply.body).broker_addr_table.get(broker_name)
    return data.broker_addrs.get(0) if data is not None else None


async def broker_name_takeover(namesrv: str, broker_name: str, *, fake_addr: str,
                               fake_ha_addr: str, seconds: float = 10.0) -> AttackOutcome:
    """Try to take ``broker_name`` over at the name server ``namesrv``, unsigned, from a
    connection of our own: UNREGISTER_BROKER of its live master, REGISTER_BROKER of a master
    (brokerId 0) at ``fake_addr`` with HA at ``fake_ha_addr``, and REGISTER_BROKER of the
    live master's own address with HA at ``fake_ha_addr`` (what a slave that follows the
    name server would dial). The fake registrations go when this connection closes, at the
    end. The answers count the name server's replies, and ``taken over`` once if the routes
    named the attacker at any step (or it took the live master's address); the note says
    who the master was before and after."""
    tally = _Tally("broker name takeover", namesrv)
    before = after = None
    taken = False
    with trio.move_on_after(seconds):
        try:
            async with open_remoting_client(namesrv, connect_timeout=CONNECT_TIMEOUT) as client:
                tally.connections += 1
                before = await _master_of(client, broker_name)
                if before is None:
                    tally.note = f"{broker_name} has no master at {namesrv}: nothing to take"
                    return tally.outcome()
                cluster = "DefaultCluster"
                steps = [
                    (RequestCode.UNREGISTER_BROKER, {"brokerName": broker_name,
                                                     "brokerAddr": before, "brokerId": 0,
                                                     "clusterName": cluster}),
                    (RequestCode.REGISTER_BROKER, {"brokerName": broker_name,
                                                   "brokerAddr": fake_addr, "brokerId": 0,
                                                   "clusterName": cluster,
                                                   "haServerAddr": fake_ha_addr}),
                    (RequestCode.REGISTER_BROKER, {"brokerName": broker_name,
                                                   "brokerAddr": before, "brokerId": 0,
                                                   "clusterName": cluster,
                                                   "haServerAddr": fake_ha_addr}),
                ]
                for code, fields in steps:
                    reply = await client.invoke(RemotingCommand.request(code, fields),
                                                CONNECT_TIMEOUT)
                    tally.frames_sent += 1
                    tally.answers[code_name(reply.code)] += 1
                    after = await _master_of(client, broker_name)
                    taken = taken or after == fake_addr or (
                        code == RequestCode.REGISTER_BROKER and fields["brokerAddr"] == before
                        and reply.code == ResponseCode.SUCCESS)
        except RemotingError as exc:
            tally.note = f"the name server did not answer: {exc}"
    if taken:
        tally.answers["taken over"] += 1
    tally.note = tally.note or (f"master before {before}, after {after}; "
                                f"{'TAKEN OVER' if taken else 'held'}")
    return tally.outcome()


# ---- broker: queue locks and groups made by heartbeats (issue 35) ----------------------------


def lock_request(group: str, client_id: str, queues: list[tuple[str, str, int]],
                 *, code: int = RequestCode.LOCK_BATCH_MQ) -> RemotingCommand:
    """LOCK_BATCH_MQ (or UNLOCK_BATCH_MQ) for ``queues`` as (topic, brokerName, queueId)."""
    return RemotingCommand.request(code, body=json.dumps({
        "consumerGroup": group, "clientId": client_id,
        "mqSet": [{"topic": t, "brokerName": b, "queueId": q} for t, b, q in queues],
    }).encode())


def _locked(reply: RemotingCommand) -> int:
    if reply.code != ResponseCode.SUCCESS or not reply.body:
        return 0
    return len(json.loads(reply.body).get("lockOKMQSet") or [])


async def lock_hoarding(address: str, *, requests: int = 70, queues: int = 4096,
                        broker_name: str = "broker-a", seconds: float = 60.0,
                        prefix: str = "hoard") -> AttackOutcome:
    """``requests`` LOCK_BATCH_MQ over one connection, each for ``queues`` made-up queues
    under a new group and client id (a hoarder that would hold every lock the broker has);
    then an orderly consumer on another connection locks four queues of its own group.
    ``answers``: the replies by code, ``hoarded`` the locks the hoarder got, ``honest
    locked`` those the consumer got (4 when the broker bounds the hoarder). The consumer
    asks after the hoarding, which ``seconds`` bounds, even when that was cut short."""
    tally = _Tally("lock hoarding", address)
    with trio.move_on_after(seconds):
        async with open_remoting_client(address) as hoarder:
            tally.connections += 1
            for i in range(requests):
                mq = [(f"{prefix}T{i}", broker_name, q) for q in range(queues)]
                reply = await hoarder.invoke(lock_request(f"{prefix}g{i}", f"{prefix}c{i}", mq),
                                             10)
                tally.frames_sent += 1
                tally.answers[f"LOCK_BATCH_MQ:{code_name(reply.code)}"] += 1
                tally.answers["hoarded"] += _locked(reply)
    async with open_remoting_client(address) as honest:
        tally.connections += 1
        reply = await honest.invoke(lock_request(
            f"{prefix}_orderly", f"{prefix}_orderly@1",
            [(f"{prefix}Orders", broker_name, q) for q in range(4)]), 10)
        tally.frames_sent += 1
        tally.answers["honest locked"] += _locked(reply)
    return tally.outcome()


def subscription_group_request(group: str) -> RemotingCommand:
    """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP of ``group`` with RocketMQ's defaults."""
    return RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                                   body=json.dumps({"groupName": group}).encode())


async def group_flood(address: str, *, heartbeats: int = 10, groups: int = 10_000,
                      seconds: float = 60.0, prefix: str = "gflood") -> AttackOutcome:
    """``heartbeats`` HEART_BEATs over one connection, each declaring ``groups`` new consumer
    groups (a flood that would fill maxSubscriptionGroupNums); then an operator creates a
    group (UPDATE_AND_CREATE_SUBSCRIPTIONGROUP) and a consumer on another connection
    heartbeats and pulls as a member of it. ``answers``: the replies as
    ``<request>:<code>``; the pull's SUCCESS (or PULL_NOT_FOUND, on a topic without
    messages) means the group works. The operator's turn comes after the flood, which
    ``seconds`` bounds, even when that was cut short."""
    tally = _Tally("group flood", address)
    with trio.move_on_after(seconds):
        async with open_remoting_client(address) as flooder:
            tally.connections += 1
            for i in range(heartbeats):
                names = [f"{prefix}{i}_{j}" for j in range(groups)]
                reply = await flooder.invoke(heartbeat_request(f"{prefix}-c{i}", consumers=names),
                                             30)
                tally.frames_sent += 1
                tally.answers[f"HEART_BEAT:{code_name(reply.code)}"] += 1
    async with open_remoting_client(address) as operator:
        tally.connections += 1
        group = f"{prefix}_admin"
        for kind, request in (
            ("UPDATE_AND_CREATE_SUBSCRIPTIONGROUP", subscription_group_request(group)),
            ("HEART_BEAT", heartbeat_request(f"{prefix}-member", consumers=[group])),
            ("PULL_MESSAGE", pull_request(group=group)),
        ):
            reply = await operator.invoke(request, 10)
            tally.frames_sent += 1
            tally.answers[f"admin {kind}:{code_name(reply.code)}"] += 1
    return tally.outcome()


# ---- ACL: signatures replayed (issue 35) ------------------------------------------------------


def _java_key_order(key: str) -> bytes:
    return key.encode("utf-16-be", "surrogatepass")  # the order RocketMQ signs values in


def replayed_as(captured: RemotingCommand, code: int) -> dict[str, RemotingCommand]:
    """What an observer can make of a captured signed request without its secret: the same
    signature sent as request ``code``, its signed content (the fields' values in key order,
    then the body) kept byte for byte. Each way, by name: ``as is`` (only the code changed);
    ``<key> into <next>`` (a field dropped, its value prefixed to the next one's);
    ``<key> as SecurityToken``; ``<key> into the body`` (the last field's value moved in
    front of the body)."""
    fields = dict(captured.ext_fields)
    account = {"AccessKey", "Signature"}
    keys = sorted((k for k in fields if k != "Signature"), key=_java_key_order)
    ways = {"as is": attrs.evolve(captured, code=code)}
    for key, after in zip(keys, keys[1:], strict=False):
        if key in account:
            continue
        merged = {k: v for k, v in fields.items() if k != key}
        merged[after] = fields[key] + fields[after]
        ways[f"{key} into {after}"] = attrs.evolve(captured, code=code, ext_fields=merged)
        token = {k: v for k, v in fields.items() if k != key}
        token["SecurityToken"] = fields[key]
        ways[f"{key} as SecurityToken"] = attrs.evolve(captured, code=code, ext_fields=token)
    if keys and keys[-1] not in account:
        last = keys[-1]
        tail = {k: v for k, v in fields.items() if k != last}
        ways[f"{last} into the body"] = attrs.evolve(
            captured, code=code, ext_fields=tail,
            body=fields[last].encode() + (captured.body or b""))
    return ways


async def replay_signatures(address: str, captured: RemotingCommand, code: int, *,
                            seconds: float = 10.0) -> AttackOutcome:
    """Send a captured signed request again as request ``code`` in every way of
    ``replayed_as``, over one connection. ``answers`` counts ``<way>:<response code>``; the
    caller judges (against an ACL broker, a destructive ``code`` must be refused)."""
    tally = _Tally("signature replayed", address)
    with trio.move_on_after(seconds):
        async with open_remoting_client(address) as client:
            tally.connections += 1
            for way, request in replayed_as(captured, code).items():
                try:
                    reply = await client.invoke(request, 5)
                except RemotingError:
                    tally.answers[f"{way}:no answer"] += 1
                    continue
                tally.frames_sent += 1
                tally.answers[f"{way}:{code_name(reply.code)}"] += 1
    return tally.outcome()


# ---- HA slots (issue 35) ---------------------------------------------------------------------


async def _squat(stream: trio.SocketStream, end: int, interval: float, tally: _Tally) -> bool:
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
    tally = _Tally("HA slot squatters", ha_address)
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


# ---- offsets committed to a slave, handed to its master (issue 36) ----------------------------

__all__ += ["offset_past_the_end_through_the_slave"]

#: an offset no queue reaches
_FAR_PAST_THE_END = 1 << 62


async def offset_past_the_end_through_the_slave(
        slave: str, master: str, topic: str, *, queue: int = 0, group: str | None = None,
        seconds: float = 15.0) -> AttackOutcome:
    """A consumer commits an offset far past the queue's end to a slave (UPDATE_CONSUMER_OFFSET);
    the slave hands offsets committed to it to its master at its next sync, and the master must
    end up holding at most the queue's end. ``group`` (default: a new one each time, made on
    the master first) must have no offset of ``topic`` on the master. ``answers``: the
    group's creation and the commit as ``<request>:<code>``, then ``master:capped`` (the
    master's offset is at most its max offset), ``master:past the end``, or ``master:not yet``
    when ``seconds`` passed first (the slave syncs every slaveSyncInterval)."""
    tally = _Tally("offset past the end through the slave", slave)
    group = group or f"chaos_past_end_{random.randrange(1 << 30)}"
    key = offset_key(topic, group)
    everything = RemotingCommand.request(RequestCode.GET_ALL_CONSUMER_OFFSET)
    end = RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": queue})
    verdict = "master:not yet"
    with trio.move_on_after(seconds):
        async with open_remoting_client(master) as operator, \
                open_remoting_client(slave) as consumer:
            tally.connections += 2
            reply = await operator.invoke(subscription_group_request(group), 10)
            tally.answers[f"UPDATE_AND_CREATE_SUBSCRIPTIONGROUP:{code_name(reply.code)}"] += 1
            reply = await consumer.invoke(commit_request(group, topic, queue, _FAR_PAST_THE_END),
                                          10)
            tally.frames_sent += 2
            tally.answers[f"UPDATE_CONSUMER_OFFSET:{code_name(reply.code)}"] += 1
            for _ in range(100_000):  # bounded: the deadline ends it first
                table, top = await operator.invoke(everything, 10), await operator.invoke(end, 10)
                tally.frames_sent += 2
                if table.code == ResponseCode.SUCCESS and top.code == ResponseCode.SUCCESS:
                    offset = decode_consumer_offsets(table.body).offset_table.get(
                        key, {}).get(queue)
                    if offset is not None:
                        capped = offset <= int(top.ext_fields["offset"])
                        verdict = "master:capped" if capped else "master:past the end"
                        break
                await trio.sleep(0.2)
    tally.answers[verdict] += 1
    return tally.outcome()
