"""HA protocol timers on memory streams with trio's autojump clock: heartbeat, housekeeping on
both sides, report interval, reconnect back-off. Virtual seconds, so each takes milliseconds;
the intervals checked are the protocol's (RocketMQ defaults: 5 s, 20 s, 5 s)."""

import itertools
from typing import Any

import trio
import trio.testing

from conftest import wait_until
from trio_ha import BrokerRole, StoreConfig, open_store
from trio_ha.store import MessageStore
from trio_ha.store.ha.master import HAService
from trio_ha.store.ha.slave import HAClient
from trio_ha.store.ha.transfer import StreamTransport
from trio_ha.wire.ha import NEED_DATA, FrameHeader, MasterProtocol, SlaveProtocol

HEARTBEAT = 5.0
HOUSEKEEPING = 20.0
BACKOFF = 5.0


def config(root, **overrides) -> StoreConfig:
    values: dict[str, Any] = dict(
        store_path_root_dir=str(root), mapped_file_size_commit_log=64 * 1024,
        mapped_file_size_consume_queue=2000, ha_listen_port=0, ha_bind_address="127.0.0.1",
    )
    values.update(overrides)
    return StoreConfig(**values)


def ha_service_of(master: MessageStore) -> HAService:
    assert master.ha_service is not None  # the config sets ha_listen_port
    return master.ha_service


def near(value: float, expected: float) -> bool:
    return abs(value - expected) < 0.05


async def read_frames(stream, protocol, count):
    """Virtual times at which ``count`` frame headers arrive, or the time the stream closed."""
    times = []
    while len(times) < count:
        data = await stream.receive_some()
        if not data:
            return times, trio.current_time()
        protocol.receive_data(data)
        while (event := protocol.next_event()) is not NEED_DATA:
            if isinstance(event, FrameHeader):
                times.append(trio.current_time())
    return times, None


async def test_master_heartbeats_an_idle_slave_every_interval(tmp_path, autojump_clock):
    async with open_store(config(tmp_path)) as master:
        master_side, slave_side = trio.testing.memory_stream_pair()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ha_service_of(master).handle_stream, master_side)
            start = trio.current_time()
            await slave_side.send_all(SlaveProtocol().send_report(0))
            times, closed = await read_frames(slave_side, SlaveProtocol(), 3)
            assert closed is None
            gaps = [b - a for a, b in itertools.pairwise([start, *times])]
            assert all(near(g, HEARTBEAT) for g in gaps), gaps
            nursery.cancel_scope.cancel()


async def test_master_closes_a_silent_slave_after_housekeeping(tmp_path, autojump_clock):
    async with open_store(config(tmp_path)) as master:
        master_side, slave_side = trio.testing.memory_stream_pair()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ha_service_of(master).handle_stream, master_side)
            start = trio.current_time()
            await slave_side.send_all(SlaveProtocol().send_report(0))
            times, closed = await read_frames(slave_side, SlaveProtocol(), 100)
            assert closed is not None and near(closed - start, HOUSEKEEPING)
            assert len(times) == 3  # heartbeats at 5, 10, 15 s, then the close at 20 s
        assert ha_service_of(master).statistics().connections == ()


class FakeMaster:
    """Accepts the client's connections over memory streams and records what happens."""

    def __init__(self, nursery, *, silent: bool = True):
        self.nursery = nursery
        self.silent = silent
        self.connected_at: list[float] = []
        self.closed_at: list[float] = []
        self.reports: list[tuple[float, int]] = []

    async def connect(self, address):
        client_side, master_side = trio.testing.memory_stream_pair()
        self.connected_at.append(trio.current_time())
        self.nursery.start_soon(self._serve, master_side)
        return StreamTransport(client_side, "fake-master")

    async def _serve(self, stream):
        protocol = MasterProtocol(log_end=2**62)
        while True:
            try:
                data = await stream.receive_some()
            except trio.BrokenResourceError:
                data = b""
            if not data:
                self.closed_at.append(trio.current_time())
                return
            protocol.receive_data(data)
            while (event := protocol.next_event()) is not NEED_DATA:
                self.reports.append((trio.current_time(), event.offset))


async def test_slave_reports_every_interval_times_out_a_silent_master_and_backs_off(
    tmp_path, autojump_clock
):
    async with open_store(config(tmp_path, broker_role=BrokerRole.SLAVE, ha_listen_port=None)) as slave:
        async with trio.open_nursery() as nursery:
            master = FakeMaster(nursery)
            client = HAClient(slave.config, slave.commitlog, "fake:1", connect=master.connect)
            start = trio.current_time()
            nursery.start_soon(client.run)
            await wait_until(lambda: len(master.connected_at) >= 3, "three connections",
                             timeout=60, interval=0.5)
            connected = [t - start for t in master.connected_at]
            # Connect at 0; the silent master is dropped at 20 s; back-off 5 s; and again.
            expected = [0.0, HOUSEKEEPING + BACKOFF, 2 * (HOUSEKEEPING + BACKOFF)]
            assert all(near(a, b) for a, b in zip(connected, expected, strict=False)), connected
            assert near(master.closed_at[0] - start, HOUSEKEEPING)
            # The first report goes out at once (RocketMQ waits 5 s), then one per interval.
            first_session = [t - start for t, _ in master.reports if t - start < HOUSEKEEPING]
            assert near(first_session[0], 0.0)
            assert all(near(b - a, HEARTBEAT) for a, b in itertools.pairwise(first_session))
            assert len(first_session) == 4  # 0, 5, 10, 15
            nursery.cancel_scope.cancel()


async def test_slave_backs_off_between_failed_connects(tmp_path, autojump_clock):
    attempts = []

    async def refuse(address):
        attempts.append(trio.current_time())
        raise ConnectionRefusedError(111, "Connection refused")

    async with open_store(config(tmp_path, broker_role=BrokerRole.SLAVE, ha_listen_port=None)) as slave:
        client = HAClient(slave.config, slave.commitlog, "fake:1", connect=refuse)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.run)
            await wait_until(lambda: len(attempts) >= 4, "four connection attempts",
                             timeout=60, interval=0.5)
            assert client.statistics().state == "backoff"
            assert "refused" in (client.statistics().last_error or "")
            nursery.cancel_scope.cancel()
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert all(near(g, BACKOFF) for g in gaps), gaps
