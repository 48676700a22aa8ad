"""Issue 9's remoting points: every resource a peer can make the server hold is bounded, per
connection and in total, and a peer that misbehaves costs its own connection and a
rate-limited log line. Real loopback sockets, small configured limits."""

import errno
import logging
import re
import select
import signal
import socket
import subprocess
import sys
import time
import tracemalloc

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from conftest import wait_until
from trio_ha.chaos import hostile
from trio_ha.chaos.hostile import closed_by_node, connect_raw
from trio_ha.chaos.hostile import request_frames as frames
from trio_ha.remoting import (
    CloseReason,
    RemotingLimits,
    RemotingServer,
    RequestError,
    not_supported,
    open_remoting_client,
)
from trio_ha.remoting.limits import FD_RESERVE_MIN
from trio_ha.testing import ClusterConfig, open_cluster
from trio_ha.testing.processes import child_env
from trio_ha.wire.remoting import (
    NEED_DATA,
    FrameDecoder,
    RemotingCommand,
    RequestCode,
    ResponseCode,
    encode,
)

ECHO, BIG, HOLD, FAIL, REFUSE = 9101, 9102, 9103, 9105, 9106
REPLY = 16 * 1024
LONG_NAME = "g" * 250 + "/"


class Handlers:
    """The requests the tests send; counts what ran and which holds ended."""

    def __init__(self):
        self.handled = 0
        self.holding = 0
        #: held requests whose hold has ended (a timeout, the peer gone, a drain)
        self.released = 0

    async def __call__(self, request, connection):
        self.handled += 1
        code = request.code
        if code == ECHO:
            await trio.lowlevel.checkpoint()
            return RemotingCommand.response_to(request, ResponseCode.SUCCESS, body=request.body)
        if code == BIG:
            await trio.lowlevel.checkpoint()
            return RemotingCommand.response_to(request, ResponseCode.SUCCESS, body=b"r" * REPLY)
        if code == HOLD:  # a long-polled pull's shape: hold, then answer
            self.holding += 1
            with connection.holding(60):
                await trio.sleep_forever()
            self.released += 1
            await connection.wait_reply_room()
            return RemotingCommand.response_to(request, ResponseCode.SUCCESS, remark="held")
        if code == FAIL:
            raise ValueError(f"the group name {LONG_NAME} is illegal\nsecond line")
        if code == REFUSE:
            raise RequestError(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                               f"the group name {LONG_NAME} is illegal")
        await trio.lowlevel.checkpoint()
        return not_supported(request)


class Served:
    def __init__(self, server, address, scope, closed):
        self.server, self.address, self.scope, self.closed = server, address, scope, closed

    def reasons(self):
        return [c.close_reason for c in self.closed]


async def serve(nursery, handlers, **limits) -> Served:
    closed = []
    server = RemotingServer(handlers, RemotingLimits(**limits), on_close=closed.append)
    scope = trio.CancelScope()

    async def run(task_status=trio.TASK_STATUS_IGNORED):
        with scope:
            await server.serve(0, host="127.0.0.1", task_status=task_status)

    host, port = await nursery.start(run)
    return Served(server, f"{host}:{port}", scope, closed)


async def raw_connect(address, *, rcvbuf=None) -> trio.SocketStream:
    """``hostile.connect_raw`` under the name test_remoting.py imports it by."""
    return await connect_raw(address, receive_buffer=rcvbuf)


class traced_memory:
    """The most Python allocated (tracemalloc) within the block, beyond what it held before."""

    def __enter__(self):
        tracemalloc.start()
        self.base = tracemalloc.get_traced_memory()[0]
        self.peak = 0
        return self

    def __exit__(self, *exc_info):
        self.peak = tracemalloc.get_traced_memory()[1] - self.base
        tracemalloc.stop()


async def sample_max(get, into: list, interval=0.005):
    while True:
        into[0] = max(into[0], get())
        await trio.sleep(interval)


async def good_round_trip(address):
    async with open_remoting_client(address) as client:
        response = await client.invoke(RemotingCommand.request(ECHO, body=b"ok"), timeout=5)
        assert response.body == b"ok"


# ---- point 5: replies waiting --------------------------------------------------------------

async def test_point_5_unread_replies_are_bounded_per_connection(nursery):
    """A peer pipelines 1,500 requests of 16 KiB replies and never reads: the server stops
    reading its requests once 64 KiB of replies wait (back-pressure), never holds much more,
    and closes the connection after the write timeout."""
    handlers = Handlers()
    served = await serve(nursery, handlers, write_buffer_high_water_mark=64 * 1024,
                         write_buffer_low_water_mark=16 * 1024, write_timeout=1.0)
    peak = [0]
    nursery.start_soon(sample_max, lambda: served.server.statistics().reply_bytes_pending, peak)
    requests = frames(BIG, 1500)
    with traced_memory() as memory:
        attack = await hostile.non_reading_clients(served.address, requests, clients=1,
                                                   receive_buffer=4096, seconds=15)
        await wait_until(lambda: served.closed, "the server to close the connection", timeout=15)
    assert attack.closed_by_node == 1
    assert served.reasons() == [CloseReason.WRITE_TIMEOUT]
    # What Python allocated at most meanwhile: 24 MiB of replies if they were all made.
    assert memory.peak < 2 * 1024 * 1024
    # The kernel's socket buffers take a few MiB; the server read no further than that.
    assert handlers.handled < 1000
    # At most the replies of the requests already running when the mark was reached.
    assert peak[0] <= 64 * 1024 + 3 * (REPLY + 64)
    assert served.server.statistics().reply_bytes_pending == 0
    await good_round_trip(served.address)


async def test_held_requests_do_not_hold_back_the_requests_behind_them(nursery):
    """Issue 11: requests read together start without a checkpoint while the replies they
    promise (each as large as the connection's largest so far) fit under the high-water mark.
    A held request (a long-polled pull) drops its promise when it starts holding: twenty held
    requests that would promise 320 KiB on a 64 KiB mark leave the connection reading, and a
    request behind them is answered at once."""
    handlers = Handlers()
    served = await serve(nursery, handlers, write_buffer_high_water_mark=64 * 1024,
                         write_buffer_low_water_mark=16 * 1024)
    async with open_remoting_client(served.address) as client:
        big = await client.invoke(RemotingCommand.request(BIG), timeout=5)  # largest: 16 KiB
        assert len(big.body) == REPLY
        async with trio.open_nursery() as holds:
            for _ in range(20):
                holds.start_soon(client.invoke, RemotingCommand.request(HOLD), 30)
            await wait_until(lambda: handlers.holding == 20, "twenty held requests")
            with trio.fail_after(2):
                echo = await client.invoke(RemotingCommand.request(ECHO, body=b"hi"), 5)
            assert echo.body == b"hi"
            holds.cancel_scope.cancel()


async def test_point_5_unread_replies_are_bounded_in_total(nursery):
    """Three such peers: all connections' replies together stay at the total bound (each
    connection alone is under its own mark); the server reads nothing meanwhile, and serves
    a good client again once the write timeout has closed the stuck ones."""
    handlers = Handlers()
    served = await serve(nursery, handlers, write_buffer_high_water_mark=1024 * 1024,
                         write_buffer_low_water_mark=0, write_buffer_total=128 * 1024,
                         write_timeout=1.0)
    peak = [0]
    nursery.start_soon(sample_max, lambda: served.server.statistics().reply_bytes_pending, peak)
    attack = await hostile.non_reading_clients(served.address, frames(BIG, 1500), clients=3,
                                               receive_buffer=4096, seconds=15)
    assert attack.connections == attack.closed_by_node == 3
    await wait_until(lambda: len(served.closed) == 3, "the three to be closed", timeout=15)
    assert set(served.reasons()) == {CloseReason.WRITE_TIMEOUT}
    assert peak[0] <= 128 * 1024 + 3 * 3 * (REPLY + 64)
    await good_round_trip(served.address)


# ---- point 6: request bytes ----------------------------------------------------------------

async def test_point_6_partial_frames_are_bounded_in_total(nursery):
    """Six peers each send 2 MiB of a frame declared 4 MiB: the server buffers at most its
    read budget (512 KiB) beyond each connection's 64 KiB, keeps serving small requests, and
    closes the six when their frames have not arrived within the request timeout."""
    handlers = Handlers()
    served = await serve(nursery, handlers, read_buffer_total=512 * 1024, request_timeout=1.0)
    peak = [0]
    nursery.start_soon(sample_max, lambda: served.server.statistics().request_bytes_buffered,
                       peak)

    async def good_round_trip_meanwhile():
        await wait_until(lambda: served.server.statistics().request_bytes_buffered > 0,
                         "the partial frames to take from the shared read budget")
        await good_round_trip(served.address)

    with traced_memory() as memory:
        async with trio.open_nursery() as both:
            both.start_soon(good_round_trip_meanwhile)
            attack = await hostile.partial_frames(served.address, connections=6,
                                                  declared=4 * 1024 * 1024,
                                                  sent=2 * 1024 * 1024, seconds=15)
        await wait_until(lambda: served.reasons().count(CloseReason.REQUEST_TIMEOUT) == 6,
                         "the six to be closed", timeout=15)
    assert attack.connections == attack.closed_by_node == 6
    # What Python allocated at most meanwhile: 12 MiB if all of it were buffered (the
    # attack's own filler is one 64 KiB slice, sent again and again).
    assert memory.peak < 3 * 1024 * 1024
    assert 0 < peak[0] <= 512 * 1024
    assert served.server.statistics().request_bytes_buffered == 0


async def test_point_6_a_slow_sender_is_closed_after_the_request_deadline(nursery):
    """One byte every 50 ms keeps a connection from ever being idle; the request timeout
    closes it all the same, and a good client is served throughout."""
    served = await serve(nursery, Handlers(), idle_timeout=30.0, request_timeout=0.5)
    frame = frames(ECHO, 1, pad="x" * 200)
    attack = await hostile.slowloris(served.address, frame, interval=0.05, seconds=10)
    assert attack.closed_by_node == 1 and attack.frames_sent == 0 and not attack.answers
    assert 0 < attack.bytes_sent < len(frame)
    await wait_until(lambda: served.closed, "the slow sender to be closed")
    assert served.reasons() == [CloseReason.REQUEST_TIMEOUT]
    await good_round_trip(served.address)


# ---- point 7: held requests of a peer that left --------------------------------------------

async def test_point_7_a_closed_connection_ends_its_held_requests_promptly(nursery):
    """The peer fills its in-flight limit with held requests (long-polled pulls), sends more
    — so the server has stopped reading it — and disconnects: the server notices although it
    is not reading, and ends the holds at once (the requests then finish, unanswered)."""
    handlers = Handlers()
    served = await serve(nursery, handlers, max_in_flight=8, hangup_check_interval=0.1)
    held = []
    all_held = trio.Event()

    async def watch_held():
        await wait_until(lambda: handlers.holding == 8, "eight requests held")
        held.append(handlers.holding)
        all_held.set()

    async with trio.open_nursery() as both:
        both.start_soon(watch_held)
        # (the peer leaves once the eight are held; 10 s is only the bound)
        attack = await hostile.abandon_long_polls(served.address, frames(HOLD, 20),
                                                  hold_seconds=10.0, frames=20, leave=all_held)
    assert held == [8]  # they were held when the peer left
    assert attack.frames_sent == 20 and not attack.answers and attack.closed_by_node == 0
    await wait_until(lambda: handlers.released == 8, "the holds to end", timeout=5)
    assert handlers.holding == 8  # (the twelve requests never read never ran)
    # (the close is recorded as the connection's nursery ends, just after the cancellations)
    await wait_until(lambda: served.reasons() != [], "the close to be recorded", timeout=5)
    assert served.reasons() == [CloseReason.PEER_CLOSED]


# ---- issue 35, defect 6: held pulls of a client gone behind unread bytes ---------------------

HELD_TOPIC = "Held"


def held_pulls(count: int) -> bytes:
    """``count`` pulls the broker holds for an hour: the queue is empty."""
    return frames(RequestCode.PULL_MESSAGE, count, consumerGroup="held", topic=HELD_TOPIC,
                  queueId=0, queueOffset=0, maxMsgNums=32, sysFlag=2, commitOffset=0,
                  suspendTimeoutMillis=3_600_000, subVersion=0)


async def remoting_series(metrics_addr: str) -> dict[str, float]:
    """The broker's remoting series for its main listener, from a real scrape."""
    host, port = metrics_addr.rsplit(":", 1)
    data = bytearray()
    with trio.fail_after(10):
        async with await trio.open_tcp_stream(host, int(port)) as stream:
            await stream.send_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n")
            while chunk := await stream.receive_some(65536):
                data += chunk
    body = bytes(data).partition(b"\r\n\r\n")[2].decode()
    return {sample.name: sample.value
            for family in text_string_to_metric_families(body) for sample in family.samples
            if sample.name.startswith("trio_ha_remoting_")
            and sample.labels.get("listener") == "main"}


async def test_held_pulls_of_a_client_gone_behind_unread_bytes_are_released_within_the_idle_timeout(
        tmp_path):
    """Issue 35, defect 6. A client fills the broker's in-flight limit with long-polled pulls
    and keeps sending, so the broker stops reading it and its receive window shuts; then it
    hangs up. Its FIN waits behind the requests the broker will not take, in the client's
    send queue: the broker never sees it, and on main held the socket (ESTABLISHED, bytes
    unread), the pulls and their memory until a message arrived. Now the idle timeout holds
    while the broker is not reading: the connection is reset and the held pulls are gone
    within it. A client that holds pulls and falls silent without a FIN, the reader still
    reading, ends by the same timeout."""
    config = ClusterConfig(data_dir=tmp_path, slaves=0, properties={
        "serverChannelMaxIdleTimeSeconds": 2, "serverMaxInFlightRequests": 64,
        "metricsPort": 0})
    with trio.fail_after(60):
        async with open_cluster(config) as cluster:
            addresses = cluster.master.started_addresses
            metrics = addresses.metrics_addr
            assert metrics is not None
            async with open_remoting_client(addresses.broker_addr) as client:
                created = await client.invoke(hostile.create_topic_request(HELD_TOPIC), 5)
                assert created.code == ResponseCode.SUCCESS
            # the silent one: eight pulls held, then nothing, and no FIN either
            silent = await connect_raw(addresses.broker_addr)
            await silent.send_all(held_pulls(8))
            most_held = 0

            async def watch(done: trio.Event) -> None:
                nonlocal most_held
                while not done.is_set():
                    series = await remoting_series(metrics)
                    most_held = max(most_held, series["trio_ha_remoting_requests_in_flight"])
                    await trio.sleep(0.05)

            done = trio.Event()
            async with trio.open_nursery() as watching:
                watching.start_soon(watch, done)
                attack = await hostile.leave_with_requests_unsent(
                    addresses.broker_addr, held_pulls(512), seconds=10)
                done.set()
            # the broker had stopped reading with its limit of pulls held, then let the
            # connection go (a reset: it closed with the client's requests unread)
            assert attack.closed_by_node == 1, attack
            assert attack.note == "" and attack.frames_sent >= 1, attack
            assert most_held >= 64
            assert await closed_by_node(silent, 10)
            await silent.aclose()
            series = await remoting_series(metrics)
            assert series["trio_ha_remoting_connections"] == 0
            assert series["trio_ha_remoting_requests_in_flight"] == 0


# ---- point 8: shutdown -----------------------------------------------------------------------

async def test_point_8_shutdown_answers_held_requests_then_closes_within_the_deadline(nursery):
    """At shutdown a held request answers at once and its reply is written; a peer that
    does not read its replies is closed when the shutdown deadline passes."""
    handlers = Handlers()
    served = await serve(nursery, handlers, shutdown_timeout=0.5)
    stuck = await connect_raw(served.address, receive_buffer=4096)
    nursery.start_soon(hostile.send_until_closed, stuck, frames(BIG, 1000))
    await wait_until(lambda: handlers.handled >= 100, "the stuck peer's replies to pile up")
    good = await connect_raw(served.address)
    await good.send_all(frames(HOLD, 1))
    await wait_until(lambda: handlers.holding == 1, "the held request")
    served.scope.cancel()
    with trio.fail_after(10):
        decoder = FrameDecoder()
        while (reply := decoder.next_command()) is NEED_DATA:
            data = await good.receive_some(65536)
            assert data, "closed before the held request answered"
            decoder.receive_data(data)
        assert reply.remark == "held"
        await wait_until(lambda: len(served.closed) == 2, "both connections closed")
    assert set(served.reasons()) == {CloseReason.SHUTDOWN}
    await good.aclose()
    await stuck.aclose()


def _start(args, *, max_fds=None):
    """``trio-ha <args>`` as a child process, with at most ``max_fds`` descriptors if given."""
    run = ("import resource, runpy, sys\n"
           "if sys.argv[1] != '-':\n"
           "    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]\n"
           "    resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), hard))\n"
           "sys.argv = ['trio-ha', *sys.argv[2:]]\n"
           "runpy.run_module('trio_ha.cli', run_name='__main__')\n")
    return subprocess.Popen([sys.executable, "-c", run, str(max_fds or "-"), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env())


def _first_line(proc, timeout=60.0) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, "the child said nothing"
    return proc.stdout.readline()


def _stop(proc):
    if proc.poll() is None:
        proc.kill()
    proc.communicate()


def test_point_8_sigterm_stops_the_broker_while_a_client_holds_unread_replies(tmp_path):
    """`trio-ha broker` with a client that pipelines pulls of a 1 MiB message and never reads
    them: SIGTERM stops it cleanly (shutdownWaitTimeSeconds=1) instead of hanging."""
    conf = tmp_path / "broker.conf"
    conf.write_text(
        "brokerRole=ASYNC_MASTER\nlistenPort=0\nbindAddress=127.0.0.1\nhaBindAddress=127.0.0.1\n"
        f"storePathRootDir={tmp_path / 'store'}\nmappedFileSizeCommitLog=8388608\n"
        "shutdownWaitTimeSeconds=1\n"
    )
    broker = _start(["broker", "-c", str(conf)])
    try:
        serving = re.search(r"serving on 127\.0\.0\.1:(\d+)", _first_line(broker))
        assert serving, "the broker did not say where it serves"
        port = int(serving[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as producer:
            producer.sendall(encode(RemotingCommand.request(
                RequestCode.SEND_MESSAGE_V2, {"a": "pg", "b": "Big", "c": "TBW102", "d": 1,
                                              "e": 0, "f": 0, "g": 1, "h": 0},
                body=b"m" * (1024 * 1024), opaque=1)))
            assert _read_one(producer).code == ResponseCode.SUCCESS
        stuck = socket.socket()
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stuck.connect(("127.0.0.1", port))
        pull = {"consumerGroup": "cg", "topic": "Big", "queueId": 0, "queueOffset": 0,
                "maxMsgNums": 32, "sysFlag": 0, "commitOffset": 0,
                "suspendTimeoutMillis": 0, "subVersion": 0}
        stuck.sendall(frames(RequestCode.PULL_MESSAGE, 64, **pull))  # 64 MiB of replies
        _wait_for_backlog(broker.pid)
        broker.send_signal(signal.SIGTERM)
        out, err = broker.communicate(timeout=60)
        assert broker.returncode == 0, err
        assert "shutting down" in out
        stuck.close()
    finally:
        _stop(broker)


def _read_one(sock) -> RemotingCommand:
    decoder = FrameDecoder()
    while (command := decoder.next_command()) is NEED_DATA:
        data = sock.recv(65536)
        assert data, "closed"
        decoder.receive_data(data)
    return command


def _wait_for_backlog(pid, timeout=10.0):
    """Until the broker has replies it cannot write: its send queue to us holds more than our
    4 KiB receive window (it stays small: the window never lets the kernel grow it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(["ss", "-tnpH", "state", "established"], capture_output=True,
                             text=True).stdout
        for line in out.splitlines():
            fields = line.split()
            if f"pid={pid}," in line and int(fields[1]) > 8192:  # Send-Q
                return
        time.sleep(0.1)
    pytest.fail(f"no backlog of replies to us in the broker's send queue after {timeout:g} s")


# ---- point 10 (descriptors): connection limits -----------------------------------------------

async def test_point_10_connections_beyond_the_limit_are_refused(nursery):
    """Four connections per listener: the fifth and sixth are closed at once, the four are
    served, and once two leave, new connections are served again."""
    served = await serve(nursery, Handlers(), max_connections=4)
    kept = [await connect_raw(served.address) for _ in range(4)]
    await wait_until(lambda: served.server.statistics().connections == 4, "four connections")
    extra = [await connect_raw(served.address) for _ in range(2)]
    for stream in extra:
        assert await closed_by_node(stream, timeout=5)
    assert served.server.statistics().refused == 2
    for stream in kept:
        await stream.send_all(frames(ECHO, 1))
        decoder = FrameDecoder()
        with trio.fail_after(5):
            while decoder.next_command() is NEED_DATA:
                decoder.receive_data(await stream.receive_some(65536))
    for stream in kept[:2]:
        await stream.aclose()
    await wait_until(lambda: served.server.statistics().connections == 2, "two to leave")
    await good_round_trip(served.address)
    for stream in [*kept[2:], *extra]:
        await stream.aclose()


class _OutOfDescriptors:
    """A listener whose first accepts fail with EMFILE, as when the process has none left."""

    def __init__(self, listener, failures):
        self.listener, self.failures = listener, failures
        self.socket = listener.socket

    async def accept(self):
        if self.failures:
            self.failures -= 1
            await trio.lowlevel.checkpoint()
            raise OSError(errno.EMFILE, "Too many open files")
        return await self.listener.accept()

    async def aclose(self):
        await self.listener.aclose()


async def test_point_10_out_of_descriptors_on_accept_backs_off_and_keeps_accepting(nursery):
    (listener,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
    flaky = _OutOfDescriptors(listener, failures=3)
    server = RemotingServer(Handlers(), RemotingLimits())
    host, port = await nursery.start(lambda task_status: server.serve(
        listeners=[flaky], task_status=task_status))  # type: ignore[list-item]
    await good_round_trip(f"{host}:{port}")
    assert server.statistics().accept_errors == 3


def test_point_10_connections_stay_under_the_fd_limit(tmp_path):
    """A name server whose process may open 400 descriptors, and 250 connections: those
    beyond what the descriptors allow (less the reserve for everything else) are refused at
    once rather than left unanswered, and it keeps serving."""
    namesrv = _start(["namesrv", "--port", "0", "--bind", "127.0.0.1"], max_fds=400)
    conns = []
    try:
        listening = re.search(r":(\d+)$", _first_line(namesrv).strip())
        assert listening
        port = int(listening[1])
        for _ in range(250):
            conns.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        allowed = 400 - FD_RESERVE_MIN  # connections the descriptors allow, less the reserve
        refused = _wait_refused(conns, 250 - allowed)
        assert refused == 250 - allowed
        for conn in conns:
            conn.close()
        conns.clear()
        assert _served_again(port).code == ResponseCode.SUCCESS
        assert namesrv.poll() is None
    finally:
        for conn in conns:
            conn.close()
        _stop(namesrv)


def _served_again(port, timeout=10.0) -> RemotingCommand:
    """A request's answer once the server has seen the closed connections go (until then a
    new connection may still be over the limit and refused)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as good:
                good.sendall(encode(RemotingCommand.request(
                    RequestCode.GET_BROKER_CLUSTER_INFO, opaque=1)))
                good.settimeout(10)
                return _read_one(good)
        except (ConnectionResetError, AssertionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _wait_refused(conns, expected, timeout=10.0) -> int:
    """How many of ``conns`` the server has closed, once ``expected`` are or time is up."""
    refused: set[int] = set()
    deadline = time.monotonic() + timeout
    while len(refused) < expected and time.monotonic() < deadline:
        for i, conn in enumerate(conns):
            if i in refused:
                continue
            conn.setblocking(False)
            try:
                if conn.recv(1) == b"":
                    refused.add(i)
            except BlockingIOError:
                pass
            except ConnectionResetError:
                refused.add(i)
        time.sleep(0.05)
    time.sleep(0.2)  # and no more than that
    for i, conn in enumerate(conns):
        if i not in refused:
            try:
                if conn.recv(1) == b"":
                    refused.add(i)
            except BlockingIOError:
                pass
            except ConnectionResetError:
                refused.add(i)
    return len(refused)


# ---- point 11 (transport): bad input --------------------------------------------------------

async def test_point_11_bad_input_is_a_one_line_answer_and_at_most_a_rate_limited_line(
    nursery, caplog
):
    """200 requests a handler fails on with an unexpected error (a 250-character name ending
    in '/', a message of two lines) and 200 it refuses with a typed error: each gets a
    one-line answer; the log gets at most one traceback, and nothing for the refusals."""
    caplog.set_level(logging.INFO, logger="trio_ha.remoting")
    served = await serve(nursery, Handlers())
    async with open_remoting_client(served.address) as client:
        for _ in range(200):
            failed = await client.invoke(RemotingCommand.request(FAIL), timeout=5)
            assert failed.code == ResponseCode.SYSTEM_ERROR
            assert failed.remark is not None and "\n" not in failed.remark
            assert failed.remark.startswith("ValueError: the group name ggg")
            assert len(failed.remark) <= 256
            refused = await client.invoke(RemotingCommand.request(REFUSE), timeout=5)
            assert refused.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
            assert refused.remark is not None and refused.remark.startswith("the group name")
            assert len(refused.remark) <= 256
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert len(tracebacks) <= 1
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) <= 1


async def test_point_11_bad_frames_from_many_connections_are_a_rate_limited_line(
    nursery, caplog
):
    caplog.set_level(logging.INFO, logger="trio_ha.remoting")
    served = await serve(nursery, Handlers())
    attack = await hostile.bad_frames(served.address, connections=50, seconds=60)
    assert attack.connections == attack.frames_sent == attack.closed_by_node == 50
    await wait_until(lambda: len(served.closed) == 50, "the fifty to be closed")
    assert set(served.reasons()) == {CloseReason.BAD_FRAME}
    lines = [r for r in caplog.records if "bad frame" in r.getMessage()]
    assert len(lines) <= 2  # one, or none when an earlier test's was within the interval
    await good_round_trip(served.address)


def test_limits_refuse_a_low_water_mark_over_the_high_one():
    with pytest.raises(ValueError, match="write_buffer_low_water_mark"):
        RemotingLimits(write_buffer_low_water_mark=2, write_buffer_high_water_mark=1)
