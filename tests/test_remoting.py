"""The remoting server and client over real loopback sockets, with the habits of real RocketMQ
clients reproduced by hand-built frames, and hostile peers."""

import json
import os
import struct
from typing import Any

import pytest
import trio
import trio.testing

from conftest import TaskCounts, wait_until
from trio_ha.remoting import RemotingLimits, not_supported, open_remoting_client, serve_remoting
from trio_ha.remoting.client import RemotingTimeout
from trio_ha.wire.remoting import (
    NEED_DATA,
    FrameDecoder,
    RemotingCommand,
    RemotingFlag,
    ResponseCode,
    encode,
)

ECHO, SLOW, FAIL = 9001, 9002, 9003


async def handler(request, connection):
    if request.code == ECHO:
        return RemotingCommand.response_to(
            request, ResponseCode.SUCCESS, ext_fields=request.ext_fields, body=request.body
        )
    if request.code == SLOW:
        await trio.sleep(float(request.ext_fields["sleep"]))
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS, remark=request.ext_fields["sleep"])
    if request.code == FAIL:
        raise ValueError("processor bug")
    return not_supported(request)


@pytest.fixture
async def server(nursery):
    host, port = await nursery.start(lambda task_status: serve_remoting(
        handler, 0, host="127.0.0.1", limits=RemotingLimits(idle_timeout=2.0),
        task_status=task_status))
    return f"127.0.0.1:{port}"


def json_frame(header: dict, body: bytes = b"") -> bytes:
    head = json.dumps(header).encode()
    return struct.pack(">ii", 4 + len(head) + len(body), len(head)) + head + body


async def connect(address):
    host, port = address.split(":")
    return await trio.open_tcp_stream(host, int(port))


async def read_commands(stream, count, timeout=5.0):
    decoder = FrameDecoder()
    commands = []
    with trio.fail_after(timeout):
        while len(commands) < count:
            data = await stream.receive_some(65536)
            assert data, "server closed the connection"
            decoder.receive_data(data)
            while (command := decoder.next_command()) is not NEED_DATA:
                commands.append(command)
    return commands


async def test_request_response_round_trip(server):
    async with open_remoting_client(server) as client:
        request = RemotingCommand.request(ECHO, {"a": "1"}, body=b"payload")
        response = await client.invoke(request, timeout=3)
        assert response.is_response and response.code == ResponseCode.SUCCESS
        assert response.ext_fields == {"a": "1"} and response.body == b"payload"


async def test_ext_fields_as_json_numbers_and_booleans_are_accepted(server):
    stream = await connect(server)
    frame = json_frame({"code": ECHO, "language": "GO", "version": 0, "opaque": 7, "flag": 0,
                        "extFields": {"queueId": 3, "batch": True, "offset": 12345678901}})
    await stream.send_all(frame)
    (response,) = await read_commands(stream, 1)
    assert response.opaque == 7 and response.flag & RemotingFlag.RESPONSE
    assert response.ext_fields == {"queueId": "3", "batch": "true", "offset": "12345678901"}
    await stream.aclose()


async def test_replies_go_out_in_completion_order(server):
    stream = await connect(server)
    for opaque, delay in ((1, "0.3"), (2, "0.0"), (3, "0.15")):
        await stream.send_all(encode(RemotingCommand.request(SLOW, {"sleep": delay}, opaque=opaque)))
    responses = await read_commands(stream, 3)
    assert [r.opaque for r in responses] == [2, 3, 1]
    await stream.aclose()


async def test_oneway_requests_get_no_reply(server):
    stream = await connect(server)
    await stream.send_all(encode(RemotingCommand.request(ECHO, {"x": "1"}, opaque=5, oneway=True)))
    await stream.send_all(encode(RemotingCommand.request(ECHO, {"x": "2"}, opaque=6)))
    (response,) = await read_commands(stream, 1)
    assert response.opaque == 6
    with trio.move_on_after(0.2):
        assert not await stream.receive_some(65536)  # nothing else arrives
    await stream.aclose()


async def test_64_requests_in_flight_on_one_connection(server):
    async with open_remoting_client(server) as client:
        results = {}

        async def call(i):
            response = await client.invoke(RemotingCommand.request(SLOW, {"sleep": "0.2"}), timeout=5)
            results[i] = response.remark

        with trio.fail_after(3):  # 64 x 0.2 s in sequence would take 12.8 s
            async with trio.open_nursery() as nursery:
                for i in range(64):
                    nursery.start_soon(call, i)
        assert len(results) == 64


async def test_unknown_code_and_processor_errors_get_error_responses(server):
    async with open_remoting_client(server) as client:
        unknown = await client.invoke(RemotingCommand.request(4242), timeout=3)
        assert unknown.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        assert unknown.remark is not None and "4242" in unknown.remark
        failed = await client.invoke(RemotingCommand.request(FAIL), timeout=3)
        assert failed.code == ResponseCode.SYSTEM_ERROR
        assert failed.remark is not None and "processor bug" in failed.remark
        assert (await client.invoke(RemotingCommand.request(ECHO), timeout=3)).code == ResponseCode.SUCCESS


async def test_client_call_timeout_leaves_the_connection_usable(server):
    async with open_remoting_client(server) as client:
        with pytest.raises(RemotingTimeout):
            await client.invoke(RemotingCommand.request(SLOW, {"sleep": "1"}), timeout=0.1)
        assert (await client.invoke(RemotingCommand.request(ECHO), timeout=3)).code == ResponseCode.SUCCESS


async def test_a_call_times_out_at_its_deadline_though_a_later_one_came_first(nursery):
    """A call's timeout is kept by the connection's timer, not by a cancel scope: a call
    made after another with a later deadline still ends at its own (the timer's wake-up
    moves earlier), calls answered in time leave the timer's heap, and so do calls that
    are cancelled."""
    host, port = await nursery.start(lambda task_status: serve_remoting(
        handler, 0, host="127.0.0.1", limits=RemotingLimits(idle_timeout=60.0),
        task_status=task_status))
    async with open_remoting_client(f"{host}:{port}") as client:
        late_done = trio.Event()
        late_scope = trio.CancelScope()

        async def late() -> None:
            with late_scope:
                await client.invoke(RemotingCommand.request(SLOW, {"sleep": "60"}),
                                    deadline=trio.current_time() + 30)
            late_done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(late)
            await trio.testing.wait_all_tasks_blocked()
            assert client._deadlines  # the first call's deadline, on the heap
            start = trio.current_time()
            with pytest.raises(RemotingTimeout, match="within the caller's deadline"):
                await client.invoke(RemotingCommand.request(SLOW, {"sleep": "60"}),
                                    deadline=start + 0.2)
            # at its own deadline, not before (the trio clock the timer reads), and not at
            # the first call's: that call still waits, its deadline still on the heap
            assert trio.current_time() >= start + 0.2
            assert not late_done.is_set() and len(client._deadlines) == 1
            for _ in range(50):  # answered in time: they do not pile up on the heap
                response = await client.invoke(RemotingCommand.request(ECHO),
                                               deadline=trio.current_time() + 3)
                assert response.code == ResponseCode.SUCCESS
            late_scope.cancel()
            await late_done.wait()
        assert client._deadlines == []  # the first cancelled, the rest answered or ended
        # the connection still serves, and a timeout (seconds from now) works the same way
        with pytest.raises(RemotingTimeout, match="within 0.1 s"):
            await client.invoke(RemotingCommand.request(SLOW, {"sleep": "1"}), timeout=0.1)
        assert (await client.invoke(RemotingCommand.request(ECHO), timeout=3)).code \
            == ResponseCode.SUCCESS


HOSTILE = {
    "zero_length": struct.pack(">i", 0),
    "negative_length": struct.pack(">i", -1),
    "oversized_length": struct.pack(">i", 0x7FFFFFFF) + b"x" * 100,
    "header_length_beyond_frame": struct.pack(">ii", 10, 1000) + b"{" * 6,
    "invalid_json": struct.pack(">ii", 12, 8) + b"{not jso",
    "wrong_field_types": json_frame({"code": "ten", "opaque": [], "flag": 0}),
    "unknown_serialize_type": struct.pack(">ii", 6, (7 << 24) | 2) + b"{}",
}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
async def test_hostile_frames_cost_only_their_own_connection(server, kind):
    async with open_remoting_client(server) as good:
        bad = await connect(server)
        await bad.send_all(HOSTILE[kind])
        with trio.fail_after(3):
            assert await bad.receive_some(65536) == b""  # closed by the server
        await bad.aclose()
        assert (await good.invoke(RemotingCommand.request(ECHO, body=b"ok"), timeout=3)).body == b"ok"


async def test_half_a_frame_then_silence_is_closed_at_idle_timeout(server):
    async with open_remoting_client(server) as good:
        bad = await connect(server)
        frame = encode(RemotingCommand.request(ECHO, body=b"x" * 100))
        await bad.send_all(frame[: len(frame) // 2])
        with trio.fail_after(5):
            while True:  # the well-behaved client keeps working meanwhile
                assert (await good.invoke(RemotingCommand.request(ECHO), timeout=3)).code == 0
                with trio.move_on_after(0.1):
                    assert await bad.receive_some(65536) == b""
                    break
        await bad.aclose()


# ---- what the speed relies on (issue 11): writes gathered per scheduling round ---------------


class CountingStream(trio.abc.Stream):
    """A stream that records every ``send_all``: what a peer would see as separate writes."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner
        self.writes: list[bytes] = []

    async def send_all(self, data) -> None:
        self.writes.append(bytes(data))
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes=None):
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


def frames_of(data: bytes) -> list[RemotingCommand]:
    """Every frame of ``data``, which must be whole frames and nothing else."""
    decoder = FrameDecoder()
    decoder.receive_data(data)
    commands = []
    while (command := decoder.next_command()) is not NEED_DATA:
        commands.append(command)
    assert decoder.buffered == 0
    return commands


async def test_client_gathers_the_requests_of_a_round_into_one_write_and_matches_replies(nursery):
    from trio_ha.remoting.client import RemotingClient

    ours, theirs = trio.testing.memory_stream_pair()
    counting = CountingStream(ours)
    client = RemotingClient("memory", counting)
    await nursery.start(client.run)
    answers = {}

    async def call(i):
        response = await client.invoke(RemotingCommand.request(ECHO, {"i": i}), timeout=5)
        answers[i] = response.ext_fields["i"]

    async with trio.open_nursery() as calls:
        for i in range(32):
            calls.start_soon(call, i)
        # The 32 calls queue in one round: one write of 32 whole frames, distinct opaques.
        requests = await read_commands(theirs, 32)
        assert len(counting.writes) == 1
        assert [r.ext_fields["i"] for r in frames_of(counting.writes[0])] == [
            r.ext_fields["i"] for r in requests]
        assert len({r.opaque for r in requests}) == 32
        # Answered in reverse, in one write: each call gets the reply to its own request.
        await theirs.send_all(b"".join(
            encode(RemotingCommand.response_to(r, ResponseCode.SUCCESS, ext_fields=r.ext_fields))
            for r in reversed(requests)))
    assert answers == {i: str(i) for i in range(32)}
    await client.aclose()


async def test_server_gathers_the_replies_of_a_round_into_one_write_in_whole_frames(nursery):
    from trio_ha.remoting import serve_connection

    ours, theirs = trio.testing.memory_stream_pair()
    counting = CountingStream(ours)
    nursery.start_soon(serve_connection, counting, handler)
    # The first reply tells the server how large its replies are (until then it starts one
    # request per round, so replies it cannot size cannot pass its reply bound).
    await theirs.send_all(encode(RemotingCommand.request(ECHO, opaque=1)))
    assert [r.opaque for r in await read_commands(theirs, 1)] == [1]
    counting.writes.clear()
    await theirs.send_all(b"".join(
        encode(RemotingCommand.request(ECHO, {"i": i}, body=b"b" * i, opaque=100 + i))
        for i in range(32)))
    replies = await read_commands(theirs, 32)
    assert sorted(r.opaque for r in replies) == [100 + i for i in range(32)]
    assert all(r.body == b"b" * (r.opaque - 100) for r in replies)
    # Requests read together finish together: their replies leave in one write.
    assert len(counting.writes) == 1
    assert len(frames_of(counting.writes[0])) == 32
    await theirs.aclose()


def serve_in_memory(nursery, handle, limits=None):
    """A connection over a memory stream served in ``nursery``: the connection, the peer's
    end, and an event set once serving has ended."""
    from trio_ha.remoting import RemotingConnection

    ours, theirs = trio.testing.memory_stream_pair()
    connection = RemotingConnection(ours, "memory", limits or RemotingLimits())
    done = trio.Event()

    async def serve():
        await connection.serve(handle)
        done.set()

    nursery.start_soon(serve)
    return connection, theirs, done


async def test_a_peer_that_hangs_up_loses_its_replies_not_its_requests(nursery):
    """Requests read whole are carried out though their peer has gone (a producer's last
    oneway sends arrive with its FIN behind them): the reader stops, the requests running
    finish, their replies are dropped, and then the connection ends."""
    from trio_ha.remoting import CloseReason, RemotingConnection

    carried_out = []

    async def recording(request, connection):
        await trio.sleep(float(request.ext_fields["sleep"]))
        carried_out.append(request.opaque)
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)

    ours, theirs = trio.testing.memory_stream_pair()
    counting = CountingStream(ours)
    connection = RemotingConnection(counting, "memory")
    done = trio.Event()

    async def serve():
        await connection.serve(recording)
        done.set()

    nursery.start_soon(serve)
    oneway = RemotingCommand.request(SLOW, {"sleep": "0.5"}, opaque=7, oneway=True)
    await theirs.send_all(encode(oneway) + encode(RemotingCommand.request(
        SLOW, {"sleep": "0.3"}, opaque=8)))
    await wait_until(lambda: connection.in_flight == 2, "both requests to start")
    await theirs.aclose()  # the peer leaves while its requests run
    with trio.fail_after(5):
        await done.wait()
    assert sorted(carried_out) == [7, 8]  # both were carried out to the end
    assert connection.close_reason is CloseReason.PEER_CLOSED
    assert counting.writes == []  # the reply was never written
    assert connection.pending_reply_bytes == 0 and connection.in_flight == 0


async def test_requests_of_a_peer_gone_are_cancelled_after_the_finish_timeout(nursery):
    """What a departed peer left running gets ``finish_timeout``, not forever."""
    from trio_ha.remoting import CloseReason

    connection, theirs, done = serve_in_memory(nursery, handler,
                                               RemotingLimits(finish_timeout=0.2))
    await theirs.send_all(encode(RemotingCommand.request(SLOW, {"sleep": "30"}, opaque=7)))
    await wait_until(lambda: connection.in_flight == 1, "the request to start")
    await theirs.aclose()
    with trio.fail_after(5):
        await done.wait()
    assert connection.close_reason is CloseReason.PEER_CLOSED
    assert connection.in_flight == 0


async def test_a_bad_frame_cancels_the_requests_of_its_connection_at_once(nursery):
    """A peer closed for misbehaving gets no grace: its requests are cancelled with it."""
    from trio_ha.remoting import CloseReason

    connection, theirs, done = serve_in_memory(nursery, handler)
    await theirs.send_all(encode(RemotingCommand.request(SLOW, {"sleep": "30"}, opaque=7)))
    await wait_until(lambda: connection.in_flight == 1, "the request to start")
    await theirs.send_all(struct.pack(">ii", 8, 99) + b"\0" * 4)  # a header longer than its frame
    with trio.fail_after(3):
        await done.wait()
    assert connection.close_reason is CloseReason.BAD_FRAME
    assert connection.in_flight == 0


MAPPED = 9004


async def test_mapped_replies_reach_a_slow_reader_whole_and_in_order_of_their_opaques(nursery):
    """Replies whose bodies are views of a mapping (a pull's records) go to the socket as
    they are: a lone one written by its request, others gathered into sendmsg calls; a peer
    that reads slowly (a 4 KiB receive buffer) makes those writes partial, which must resume
    mid-buffer: every frame arrives whole, each body is the bytes its views showed, and
    opaques match."""
    import mmap

    from trio_ha.wire.remoting import MappedReply

    mapping = mmap.mmap(-1, 1 << 20)
    mapping[:] = bytes(range(256)) * 4096
    whole = memoryview(mapping)

    def views_for(i: int) -> tuple[memoryview, ...]:
        # 1 to 12 views of 1 byte to 8 KiB each, at offsets that vary with i
        return tuple(whole[(i * 7919 + k * 65537) % (1 << 19):][: 1 + (i * 131 + k) % 8192]
                     for k in range(1 + i % 12))

    async def mapped_handler(request, connection):
        if request.code == MAPPED and "whole" in request.ext_fields:
            reply = RemotingCommand.response_to(request, ResponseCode.SUCCESS)
            return MappedReply(reply, (whole,) * 4)
        if request.code == MAPPED:
            i = int(request.ext_fields["i"])
            reply = RemotingCommand.response_to(request, ResponseCode.SUCCESS,
                                                ext_fields={"i": i})
            return MappedReply(reply, views_for(i))
        return await handler(request, connection)

    host, port = await nursery.start(lambda task_status: serve_remoting(
        mapped_handler, 0, host="127.0.0.1", task_status=task_status))
    from test_remoting_limits import raw_connect

    peer = await raw_connect(f"127.0.0.1:{port}", rcvbuf=4096)
    # A lone reply is written by its request; 4 MiB is more than the socket takes at once,
    # and the rest goes to the writer, in order.
    await peer.send_all(encode(RemotingCommand.request(MAPPED, {"whole": "1"}, opaque=7)))
    (lone,) = await read_commands(peer, 1, timeout=20)
    assert lone.opaque == 7 and lone.body == bytes(mapping) * 4
    requests = [RemotingCommand.request(MAPPED if i % 3 else ECHO, {"i": i},
                                        body=b"e" * (i % 3 == 0) * i, opaque=1000 + i)
                for i in range(200)]
    await peer.send_all(b"".join(encode(r) for r in requests))
    replies = []
    decoder = FrameDecoder()
    with trio.fail_after(20):
        while len(replies) < len(requests):
            data = await peer.receive_some(4096)
            assert data, "server closed the connection"
            decoder.receive_data(data)
            while (command := decoder.next_command()) is not NEED_DATA:
                replies.append(command)
    assert sorted(r.opaque for r in replies) == [r.opaque for r in requests]
    for reply in replies:
        i = reply.opaque - 1000
        assert reply.ext_fields["i"] == str(i)
        expected = b"".join(views_for(i)) if i % 3 else b"e" * i
        assert reply.body == expected, i
    await peer.aclose()


async def test_a_flushed_call_is_written_by_its_caller_and_never_inside_another_frame(nursery):
    """``invoke(flush=True)`` (pulls use it) writes its frame from the calling task when
    nothing is queued or being written — here no writer task even runs, and the peer still
    gets it, while an unflushed call's frame waits for the writer. While the writer is in
    the middle of a large frame (the peer not reading), a flushed call must queue behind it:
    the peer reads whole frames, in order."""
    import functools
    import socket as stdlib_socket

    from trio_ha.remoting.client import RemotingClient

    ours, theirs = trio.socket.socketpair()
    client = RemotingClient("pair", trio.SocketStream(ours))  # no run(): no writer, no reader
    async with trio.open_nursery() as calls:
        calls.start_soon(functools.partial(
            client.invoke, RemotingCommand.request(ECHO, {"n": "flushed"}), 5, flush=True))
        await trio.testing.wait_all_tasks_blocked()
        calls.start_soon(functools.partial(
            client.invoke, RemotingCommand.request(ECHO, {"n": "queued"}), 5))
        await trio.testing.wait_all_tasks_blocked()
        data = await theirs.recv(65536)
        assert [c.ext_fields["n"] for c in frames_of(data)] == ["flushed"]
        with trio.move_on_after(0.1) as quiet:  # the other one waits for a writer
            await theirs.recv(65536)
        assert quiet.cancelled_caught
        calls.cancel_scope.cancel()
    await client.aclose()
    theirs.close()

    ours, theirs = trio.socket.socketpair()
    theirs.setsockopt(stdlib_socket.SOL_SOCKET, stdlib_socket.SO_RCVBUF, 4096)
    client = RemotingClient("pair", trio.SocketStream(ours))
    await nursery.start(client.run)
    big = RemotingCommand.request(ECHO, {"n": "big"}, body=b"B" * (4 << 20))
    async with trio.open_nursery() as calls:
        calls.start_soon(functools.partial(client.invoke, big, 10))
        await wait_until(lambda: client._writing, "the writer to be inside the big frame")
        decoder, names = FrameDecoder(), []
        for i in range(8):
            # Room in the socket, and a flushed call in the same round as the writer's wake.
            decoder.receive_data(await theirs.recv(65536))
            calls.start_soon(functools.partial(
                client.invoke, RemotingCommand.request(ECHO, {"n": str(i)}), 10, flush=True))
        with trio.fail_after(10):
            while len(names) < 9:
                decoder.receive_data(await theirs.recv(65536))
                while (command := decoder.next_command()) is not NEED_DATA:
                    names.append(command.ext_fields["n"])
        assert names[0] == "big" and sorted(names[1:]) == [str(i) for i in range(8)]
        calls.cancel_scope.cancel()
    await client.aclose()
    theirs.close()


async def test_frames_past_write_early_are_written_by_their_callers_not_at_the_rounds_end(
        nursery):
    """A round's frames gathered into one write put sixteen producers and the broker in
    lockstep; once WRITE_EARLY bytes are queued, the call that crossed the mark writes them
    itself. Here no writer task runs yet: the peer still gets the frames of the crossings,
    whole and in order, and the rest (under the mark) wait for the writer; every call then
    gets its own reply."""

    from trio_ha.remoting.client import WRITE_EARLY, RemotingClient

    ours, theirs = trio.socket.socketpair()
    client = RemotingClient("pair", trio.SocketStream(ours))  # no run() yet: no writer
    answers, queued = {}, []

    async def call(i):
        request = RemotingCommand.request(ECHO, {"i": str(i)}, body=b"x" * 1024)
        queued.append(str(i))  # invoke queues its frame before its first checkpoint
        answers[i] = (await client.invoke(request, 10)).ext_fields["i"]

    async with trio.open_nursery() as calls:
        for i in range(32):
            calls.start_soon(call, i)
        await trio.testing.wait_all_tasks_blocked()
        # What the calls wrote is in the socket now: read it all without waiting.
        decoder, early = FrameDecoder(), []
        while True:
            try:
                decoder.receive_data(os.read(theirs.fileno(), 1 << 20))
            except BlockingIOError:
                break
        while (command := decoder.next_command()) is not NEED_DATA:
            early.append(command)
        assert decoder.buffered == 0  # whole frames only
        assert 0 < len(early) < 32
        assert [c.ext_fields["i"] for c in early] == queued[:len(early)]
        assert 0 < sum(map(len, client._outbox)) < WRITE_EARLY
        await nursery.start(client.run)  # the writer takes the rest
        requests = early + await read_commands(trio.SocketStream(theirs), 32 - len(early))
        assert [c.ext_fields["i"] for c in requests] == queued
        await theirs.send(b"".join(
            encode(RemotingCommand.response_to(r, ResponseCode.SUCCESS, ext_fields=r.ext_fields))
            for r in reversed(requests)))
    assert answers == {i: str(i) for i in range(32)}
    await client.aclose()
    theirs.close()


async def test_an_early_write_cut_short_leaves_the_tail_first_and_frames_whole(nursery):
    """The socket takes part of an early write: the cut frame's tail stays at the front of
    the queue, the writer sends it before anything else, and the peer reads whole frames in
    the order they were queued."""
    import socket as stdlib_socket

    from trio_ha.remoting.client import RemotingClient

    ours, theirs = trio.socket.socketpair()
    ours.setsockopt(stdlib_socket.SOL_SOCKET, stdlib_socket.SO_SNDBUF, 4096)
    theirs.setsockopt(stdlib_socket.SOL_SOCKET, stdlib_socket.SO_RCVBUF, 4096)
    client = RemotingClient("pair", trio.SocketStream(ours))  # no run() yet: no writer
    queued = []

    async def call(i):
        queued.append(str(i))
        await client.invoke(RemotingCommand.request(ECHO, {"i": str(i)}, body=b"y" * 3000), 10)

    async with trio.open_nursery() as calls:
        for i in range(64):
            calls.start_soon(call, i)
        await trio.testing.wait_all_tasks_blocked()
        assert client._outbox and isinstance(client._outbox[0], memoryview)  # a cut frame
        await nursery.start(client.run)
        requests = await read_commands(trio.SocketStream(theirs), 64, timeout=10)
        assert [c.ext_fields["i"] for c in requests] == queued
        assert all(c.body == b"y" * 3000 for c in requests)
        calls.cancel_scope.cancel()
    await client.aclose()
    theirs.close()


class ManualPending:
    """A PendingReply the test completes by hand (``finish``): an ``Answer`` given then, or,
    with ``task=True``, a ``WaitInTask`` whose task waits for it."""

    def __init__(self, request, task: bool = False) -> None:
        from trio_ha.answer import Answer
        from trio_ha.remoting.connection import WaitInTask

        self.request = request
        self.answer = Answer()
        self.outcome = WaitInTask(self.answer.wait) if task else self.answer

    def finish(self) -> None:
        self.answer.set(RemotingCommand.response_to(self.request, ResponseCode.SUCCESS,
                                                    remark="later"))


LATER, LATER_IN_TASK, NOT_A_REPLY = 9010, 9011, 9012


class ScriptedFastHandler:
    def __init__(self) -> None:
        self.pending: list[ManualPending] = []

    def __call__(self, request, connection) -> Any:
        from trio_ha.remoting import RUN_IN_TASK

        if request.code == ECHO:
            return RemotingCommand.response_to(request, ResponseCode.SUCCESS, ext_fields=request.ext_fields)
        if request.code in (LATER, LATER_IN_TASK):
            pending = ManualPending(request, task=request.code == LATER_IN_TASK)
            self.pending.append(pending)
            return pending.outcome
        if request.code == FAIL:
            raise ValueError("fast processor bug")
        if request.code == NOT_A_REPLY:
            return object()  # neither a reply nor a PendingReply: a processor bug
        return RUN_IN_TASK


async def test_a_fast_handler_serves_a_read_without_tasks_and_answers_it_in_one_write(nursery):
    """Issue 11: requests that never wait are served in the reader's round (no task each),
    and the replies of one read leave in one write, each matching its request's opaque; a
    request the fast handler leaves (RUN_IN_TASK) runs in a task, and a fast handler's bug
    is answered SYSTEM_ERROR like a task's."""
    from trio_ha.remoting import serve_connection

    ours, theirs = trio.testing.memory_stream_pair()
    counting = CountingStream(ours)
    nursery.start_soon(lambda: serve_connection(counting, handler, fast=ScriptedFastHandler()))
    await theirs.send_all(encode(RemotingCommand.request(ECHO, opaque=1)))
    await read_commands(theirs, 1)
    counting.writes.clear()
    spawned = TaskCounts()
    trio.lowlevel.add_instrument(spawned)
    try:
        await theirs.send_all(b"".join(
            encode(RemotingCommand.request(ECHO, {"i": i}, opaque=100 + i)) for i in range(32)))
        replies = await read_commands(theirs, 32)
    finally:
        trio.lowlevel.remove_instrument(spawned)
    assert [(r.opaque, r.ext_fields["i"]) for r in replies] == [(100 + i, str(i)) for i in range(32)]
    assert len(counting.writes) == 1
    assert spawned.of(spawned.spawned, "._process") == 0
    await theirs.send_all(encode(RemotingCommand.request(SLOW, {"sleep": "0"}, opaque=7))
                          + encode(RemotingCommand.request(FAIL, opaque=8)))
    replies = {r.opaque: r for r in await read_commands(theirs, 2)}
    assert replies[7].remark == "0" and replies[8].code == ResponseCode.SYSTEM_ERROR
    assert "fast processor bug" in replies[8].remark
    await theirs.aclose()


async def test_pending_replies_are_answered_when_done_and_dropped_once_the_connection_closed(nursery):
    """A PendingReply (a SYNC_MASTER send waiting for its slave) is answered from whichever
    task completes it, with its request's opaque, while other requests are answered
    meanwhile; one that asks for a task is waited for in one; one completed after its
    connection closed is dropped without a write or an error, and what it promised of the
    reply budget is given back at the close."""
    from trio_ha.remoting import RemotingConnection

    ours, theirs = trio.testing.memory_stream_pair()
    counting = CountingStream(ours)
    connection = RemotingConnection(counting, "memory")
    fast = ScriptedFastHandler()
    closed = trio.Event()

    async def serve():
        await connection.serve(handler, fast=fast)
        closed.set()

    nursery.start_soon(serve)
    await theirs.send_all(encode(RemotingCommand.request(ECHO, opaque=1)))
    await read_commands(theirs, 1)  # replies have a size now: requests promise one
    await theirs.send_all(encode(RemotingCommand.request(LATER, opaque=2))
                          + encode(RemotingCommand.request(LATER_IN_TASK, opaque=3))
                          + encode(RemotingCommand.request(ECHO, opaque=4)))
    assert [r.opaque for r in await read_commands(theirs, 1)] == [4]
    assert connection.in_flight == 2
    fast.pending[1].finish()
    fast.pending[0].finish()
    replies = await read_commands(theirs, 2)
    assert sorted((r.opaque, r.remark) for r in replies) == [(2, "later"), (3, "later")]
    await trio.testing.wait_all_tasks_blocked()
    assert connection.in_flight == 0  # both pending replies finished

    await theirs.send_all(encode(RemotingCommand.request(LATER, opaque=5)))
    await trio.testing.wait_all_tasks_blocked()
    assert len(fast.pending) == 3  # the third pending reply, made in the reader's round
    assert connection.budgets.replies.promised > 0
    writes = len(counting.writes)
    await theirs.aclose()
    with trio.fail_after(3):
        await closed.wait()
    assert connection.budgets.replies.promised == 0
    fast.pending[2].finish()  # completes after the close: dropped
    assert len(counting.writes) == writes
    assert connection.pending_reply_bytes == 0


async def test_the_reader_writes_what_it_served_itself_and_the_writer_stays_asleep(nursery):
    """Found in issue 11's review: a read served by the fast handler woke the writer task,
    which then found the reader had written everything already. On a real socket the reader
    writes the read's replies itself and the writer takes no step; a processor bug that
    returns neither a reply nor a PendingReply is answered SYSTEM_ERROR and the connection
    goes on."""
    from trio_ha.remoting import serve_connection

    ours, theirs = trio.socket.socketpair()
    nursery.start_soon(lambda: serve_connection(trio.SocketStream(ours), handler,
                                                fast=ScriptedFastHandler()))
    peer = trio.SocketStream(theirs)
    await peer.send_all(encode(RemotingCommand.request(ECHO, opaque=1)))
    await read_commands(peer, 1)
    counts = TaskCounts()
    trio.lowlevel.add_instrument(counts)
    try:
        for round_ in range(20):
            await peer.send_all(b"".join(
                encode(RemotingCommand.request(ECHO, {"i": i}, opaque=1000 * round_ + i))
                for i in range(4)))
            replies = await read_commands(peer, 4)
            assert [r.opaque for r in replies] == [1000 * round_ + i for i in range(4)]
    finally:
        trio.lowlevel.remove_instrument(counts)
    assert counts.of(counts.steps, "._run_writer") == 0
    await peer.send_all(encode(RemotingCommand.request(NOT_A_REPLY, opaque=5))
                        + encode(RemotingCommand.request(ECHO, opaque=6)))
    replies = {r.opaque: r for r in await read_commands(peer, 2)}
    assert replies[5].code == ResponseCode.SYSTEM_ERROR and replies[6].code == ResponseCode.SUCCESS
    await peer.aclose()


async def test_after_round_runs_once_per_read_after_its_requests_and_before_their_replies(nursery):
    """Issue 11: ``after_round`` (a broker sends the round's puts to its slaves there) runs
    once per read, once the fast handler has served every request of it and before their
    replies are written, so what it starts leaves ahead of the replies that wait for it."""
    from trio_ha.remoting import serve_connection

    ours, theirs = trio.testing.memory_stream_pair()
    counting = CountingStream(ours)
    served: list[int] = []
    rounds: list[tuple[int, int]] = []

    class Counting(ScriptedFastHandler):
        def __call__(self, request, connection):
            served.append(request.opaque)
            return super().__call__(request, connection)

    nursery.start_soon(lambda: serve_connection(
        counting, handler, fast=Counting(),
        after_round=lambda: rounds.append((len(served), len(counting.writes)))))
    await theirs.send_all(b"".join(
        encode(RemotingCommand.request(ECHO, opaque=10 + i)) for i in range(5)))
    assert [r.opaque for r in await read_commands(theirs, 5)] == [10, 11, 12, 13, 14]
    assert rounds == [(5, 0)]  # after all five, before the one write of their replies
    await theirs.send_all(encode(RemotingCommand.request(ECHO, opaque=20)))
    await read_commands(theirs, 1)
    assert rounds == [(5, 0), (6, 1)]
    await theirs.aclose()
