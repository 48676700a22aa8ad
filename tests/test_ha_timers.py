"""HA protocol timers on memory streams with trio's autojump clock: heartbeat, housekeeping on
both sides, report interval, reconnect back-off. Virtual seconds, so each takes milliseconds;
the intervals checked are the protocol's (RocketMQ defaults: 5 s, 20 s, 5 s), and our bounded
reconnect back-off (20 ms doubling to 40 ms, then towards 2 s once the master has been down
for 10 s) next to RocketMQ's fixed 5 s."""

import itertools
from typing import Any

import trio
import trio.testing

from conftest import wait_until
from trio_ha import BrokerRole, Message, StoreConfig, open_store
from trio_ha.store import MessageStore
from trio_ha.store.ha.master import HAService
from trio_ha.store.ha.slave import HAClient
from trio_ha.store.ha.transfer import StreamTransport
from trio_ha.wire.ha import NEED_DATA, FrameHeader, MasterProtocol, SlaveProtocol

HEARTBEAT = 5.0
HOUSEKEEPING = 20.0
#: RocketMQ's reconnect wait, and the configuration that gives it
BACKOFF = 5.0
ROCKETMQ_BACKOFF = dict(ha_reconnect_min_interval=5000, ha_reconnect_interval=5000)
#: our default back-off: 20 ms, doubling, at most 40 ms for the first 10 s of an outage,
#: then doubling to at most 2 s
BACKOFF_MIN, BACKOFF_MAX = 0.02, 0.04
FAST_PERIOD, MAX_BACKOFF = 10.0, 2.0


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
    async with open_store(config(tmp_path, broker_role=BrokerRole.SLAVE, ha_listen_port=None,
                                 **ROCKETMQ_BACKOFF)) as slave:
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


async def refused_attempts(store_config: StoreConfig, count: int) -> list[float]:
    """The virtual times of ``count`` connection attempts to a master that refuses them."""
    attempts = []

    async def refuse(address):
        attempts.append(trio.current_time())
        raise ConnectionRefusedError(111, "Connection refused")

    async with open_store(store_config) as slave:
        client = HAClient(slave.config, slave.commitlog, "fake:1", connect=refuse)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.run)
            await wait_until(lambda: len(attempts) >= count, f"{count} connection attempts",
                             timeout=60, interval=0.01)
            assert client.statistics().state == "backoff"
            assert "refused" in (client.statistics().last_error or "")
            nursery.cancel_scope.cancel()
    return attempts[:count]


async def test_slave_backs_off_between_failed_connects_from_20_ms_doubling_to_40_ms(
        tmp_path, autojump_clock):
    attempts = await refused_attempts(
        config(tmp_path, broker_role=BrokerRole.SLAVE, ha_listen_port=None), 8)
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    expected = [0.02, 0.04, 0.04, 0.04, 0.04, 0.04, 0.04]
    assert all(abs(g - e) < 0.002 for g, e in zip(gaps, expected, strict=True)), gaps


async def test_slave_retries_a_dead_master_24_times_a_second_for_as_long_as_it_is_down(
        tmp_path, autojump_clock):
    """A master that stays down for 10 virtual minutes: the slave tries fast while a restart
    is likely (20 ms doubling to 40 ms for the first ha_reconnect_fast_period, 10 s), then
    doubles towards ha_reconnect_max_interval (2 s) and stays there; a session that had
    frames from its master makes the next outage fast again (the other tests here)."""
    attempts = []

    async def refuse(address):
        attempts.append(trio.current_time())
        raise ConnectionRefusedError(111, "Connection refused")

    async with open_store(config(tmp_path, broker_role=BrokerRole.SLAVE,
                                 ha_listen_port=None)) as slave:
        client = HAClient(slave.config, slave.commitlog, "fake:1", connect=refuse)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.run)
            await trio.sleep(600)
            nursery.cancel_scope.cancel()
    start = attempts[0]
    fast = [t for t in attempts if t - start < FAST_PERIOD]
    # The fast first reattach is kept: 25 tries a second for the first 10 s.
    assert len(fast) >= FAST_PERIOD / BACKOFF_MAX - 2, len(fast)
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert max(gaps) <= MAX_BACKOFF + 0.002, max(gaps)  # capped
    # The last 9 minutes: one try per 2 s (270), not 25 a second (13,500).
    late = [t for t in attempts if t - start >= 60]
    assert len(late) <= 540 / MAX_BACKOFF + 2, len(late)
    assert all(abs(g - MAX_BACKOFF) < 0.002 for g in gaps[-100:]), gaps[-100:]


async def test_slave_backs_off_5_s_every_time_when_configured_as_rocketmq(
        tmp_path, autojump_clock):
    attempts = await refused_attempts(
        config(tmp_path, broker_role=BrokerRole.SLAVE, ha_listen_port=None, **ROCKETMQ_BACKOFF),
        4)
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert all(near(g, BACKOFF) for g in gaps), gaps


async def test_slave_attaches_again_within_40_ms_of_a_restarted_master_where_rocketmq_waits_5_s(
        tmp_path, autojump_clock, caplog):
    """A real master (its HA service on memory streams) dies and comes back after downtimes
    from 50 ms to 32 s; its port refuses connections meanwhile. Each time the slave is copying
    again at most one back-off ceiling (40 ms; 2 s once the master has been down past the 10 s
    fast period) after the port reopened — RocketMQ's slave waits 5 s — and a long downtime
    costs at most one refused connect per 40 ms, not a busy loop, and one line in the slave's
    log, not one per refused connect."""
    master_config = config(tmp_path / "master")
    slave_config = config(tmp_path / "slave", broker_role=BrokerRole.SLAVE, ha_listen_port=None)
    async with open_store(master_config) as master, open_store(slave_config) as slave:
        service = ha_service_of(master)
        down_until = -1.0
        attempts: list[float] = []
        accepted: list[float] = []
        sessions: list[trio.CancelScope] = []

        async with trio.open_nursery() as nursery:
            async def serve(stream, scope):
                with scope:
                    await service.handle_stream(stream)

            async def connect(address):
                now = trio.current_time()
                attempts.append(now)
                if now < down_until:
                    raise ConnectionRefusedError(111, "Connection refused")
                slave_side, master_side = trio.testing.memory_stream_pair()
                scope = trio.CancelScope()
                sessions.append(scope)
                accepted.append(now)
                nursery.start_soon(serve, master_side, scope)
                return StreamTransport(slave_side, "master")

            client = HAClient(slave.config, slave.commitlog, "master:1", connect=connect)
            nursery.start_soon(client.run)
            for downtime in (0.05, 0.7, 2.9, 9.3, 31.7):
                await put_some(master, 3)
                await wait_until(lambda: slave.commitlog.max_offset == master.commitlog.max_offset,
                                 "the slave to catch up", timeout=30)
                before, sessions_before = len(attempts), len(accepted)
                lines_before = len(session_lines(caplog))
                down_until = trio.current_time() + downtime
                sessions[-1].cancel()  # the master dies
                await wait_until(lambda: len(accepted) > sessions_before,  # noqa: B023
                                 "the slave to reconnect", timeout=60, interval=0.005)
                assert accepted[-1] >= down_until
                # Within the fast period, one fast ceiling; beyond it, the slow one.
                ceiling = BACKOFF_MAX if downtime < FAST_PERIOD else MAX_BACKOFF
                assert accepted[-1] - down_until <= ceiling + 0.005, (downtime, accepted)
                refused = len(attempts) - before - 1
                assert refused <= downtime / BACKOFF_MAX + 5, (downtime, refused)
                # The served session's end is said at once; its refused successors are
                # counted, not logged (the clock is virtual: all within the real 10 s).
                assert len(session_lines(caplog)) - lines_before == 1, (downtime, refused)
            await put_some(master, 3)
            await wait_until(lambda: slave.commitlog.max_offset == master.commitlog.max_offset,
                             "the slave to catch up after the last restart", timeout=30)
            nursery.cancel_scope.cancel()


def session_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "session with master" in r.getMessage()]


async def put_some(store: MessageStore, count: int) -> None:
    for i in range(count):
        result = await store.put_message(Message("Restarts", f"m{i}".encode()))
        assert result.status.stored
