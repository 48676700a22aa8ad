"""Issue 35, defect 5, on a master's HA port: one peer (or a few) must not deny replication to
the real slave.

(a) Without haAuthSecret, 16 peers that ask for the log end and restate it held every HA slot
    (haMaxConnections) for as long as they stayed, and the real slave was refused. Now a
    connection that has not acknowledged a byte it carried (not *proven*) makes way for a
    newcomer, the longest-unproven first, and a proven slave never does.
(b) A single peer streaming reports cost the master 63% of a CPU and other clients a p99 of
    409 ms. Now a read that brings more reports than a slave has to say makes that
    connection's reader wait before the next one.

Everything runs over real loopback sockets against a real store; no test asserts a duration.
"""

from __future__ import annotations

import logging

import trio
import trio.testing

import ha_slave_process
from conftest import ha_of, wait_until
from trio_ha import Message, PutMessageStatus, StoreConfig, open_store
from trio_ha.chaos import hostile
from trio_ha.store import MessageStore
from trio_ha.wire.ha import FRAME_HEADER as FRAME
from trio_ha.wire.ha import REPORT, MasterProtocol

SEGMENT = 64 * 1024
OK = PutMessageStatus.PUT_OK


def master_config(root, **overrides) -> StoreConfig:
    """The HA-port tests' master (ha_slave_process), whose puts wait 1 s for a slave."""
    overrides.setdefault("slave_timeout", 1000)
    return ha_slave_process.master_config(root, **overrides)


def ha_address(master: MessageStore) -> str:
    assert master.ha_address is not None
    return f"{master.ha_address[0]}:{master.ha_address[1]}"


async def receive_exactly(stream: trio.abc.ReceiveStream, n: int) -> bytes:
    data = b""
    while len(data) < n:
        more = await stream.receive_some(n - len(data))
        assert more, f"{len(data)} of {n} bytes before the master closed"
        data += more
    return data


def max_offset(store: MessageStore) -> int:
    return store.statistics().max_commitlog_offset


async def put(master: MessageStore, i: int) -> PutMessageStatus:
    return (await master.put_message(Message("Slots", b"%d" % i * 50))).status


async def test_defect_5a_sixteen_squatters_restating_the_log_end_cannot_keep_the_real_slave_out(
    tmp_path, caplog,
):
    caplog.set_level(logging.INFO, logger="trio_ha.store.ha.master")
    config = master_config(tmp_path / "m")
    async with open_store(config) as master:
        for i in range(5):  # a log to learn the end of (no slave yet: not replicated)
            assert await put(master, i) is not OK
        end = max_offset(master)
        async with trio.open_nursery() as nursery:
            # They restate ``end`` every 0.1 s, and come back 0.1 s after the master closes
            # one, until the test is done with them.
            nursery.start_soon(lambda: hostile.ha_slot_squatters(
                ha_address(master), peers=config.ha_max_connections, seconds=60,
                interval=0.1, end=end))
            await wait_until(
                lambda: sum(c.start_offset == end for c in ha_of(master).connections)
                == config.ha_max_connections, "the squatters to hold every slot")
            slave_config = ha_slave_process.slave_config(str(tmp_path / "s"), ha_address(master))
            async with open_store(slave_config):
                # The slave gets a slot and replicates: SYNC puts are answered PUT_OK.
                status = None
                with trio.move_on_after(10):
                    for i in range(5, 1000):
                        if (status := await put(master, i)) is OK:
                            break
                        await trio.sleep(0.05)
                assert status is OK, (status, ha_of(master).refused_connections)
                (slave,) = [c for c in ha_of(master).connections if c.confirmed_offset is not None]
                assert slave.counted
                # The squatters keep coming back, and each evicts another of them: never the
                # proven slave, which keeps its connection and answers every put.
                evicted = ha_of(master).evicted_connections
                assert evicted >= 1
                statuses = [await put(master, 100 + i) for i in range(20)]
                await wait_until(lambda: ha_of(master).evicted_connections > evicted + 16,
                                 "the squatters to go round every slot again")
                statuses += [await put(master, 200 + i) for i in range(20)]
                assert set(statuses) == {OK}
                now = ha_of(master)
                assert [c.connected_since for c in now.connections if c.counted] == [
                    slave.connected_since]
                assert len(now.connections) == config.ha_max_connections
                # Evictions are counted, not logged one by one: a line per peer host per 10 s.
                lines = [r.getMessage() for r in caplog.records if "to make room" in r.getMessage()]
                assert len(lines) == 1 < now.evicted_connections, lines
            nursery.cancel_scope.cancel()


# ---- (b) a report flood --------------------------------------------------------------------

#: reads a second a flooding peer may get (the master waits FLOOD_PAUSE, 20 ms, after each)
FLOOD_READS_PER_SECOND = 100


async def test_defect_5b_a_report_flood_is_read_at_a_bounded_rate_while_the_slave_replicates(
    tmp_path, autojump_clock, monkeypatch,
):
    """One peer streams 4 MiB of 8-byte reports (524,288 of them) as fast as its stream
    takes them, next to a slave that acknowledges what it is sent. The master used to read
    the flood as fast as it came, a processing round per 64 KiB every scheduling turn (63% of
    a CPU, and a p99 of 409 ms for other clients). Now a read that says more than a slave
    has to say makes the reader wait before the next: the flood's processing rounds are
    bounded by the time it took, the master still reads all of it, and the slave's acks
    answer every put. Memory streams and trio's autojump clock: the time is virtual."""
    received: dict[int, list[int]] = {}
    original = MasterProtocol.receive_data

    def counting(self: MasterProtocol, data) -> None:
        seen = received.setdefault(id(self), [0, 0])
        seen[0] += 1  # processing rounds (one per read)
        seen[1] += len(data)
        original(self, data)

    monkeypatch.setattr(MasterProtocol, "receive_data", counting)
    config = master_config(tmp_path / "m", ha_housekeeping_interval=20_000)
    async with open_store(config) as master, trio.open_nursery() as nursery:
        service = master.ha_service
        assert service is not None
        flood_master, flood = trio.testing.memory_stream_pair()
        slave_master, slave = trio.testing.memory_stream_pair()
        nursery.start_soon(service.handle_stream, flood_master)
        await flood.send_all(REPORT.pack(max_offset(master)))
        await wait_until(lambda: len(service.connections) == 1, "the flood's request")
        (flood_connection,) = service.connections.values()
        nursery.start_soon(service.handle_stream, slave_master)
        at = max_offset(master)
        await slave.send_all(REPORT.pack(at))
        await wait_until(lambda: sum(c.start_offset is not None
                                     for c in service.connections.values()) == 2,
                         "the slave's request")

        async def drain() -> None:
            while await flood.receive_some(65536):
                pass

        nursery.start_soon(drain)
        flood_bytes = 4 * 1024 * 1024
        seen = received[id(flood_connection.protocol)]
        rounds, before = seen[0], seen[1]
        started = trio.current_time()
        await flood.send_all(REPORT.pack(at) * (flood_bytes // REPORT.size))

        statuses = []
        for i in range(10):
            async with trio.open_nursery() as one:
                async def put_one(i=i) -> None:
                    statuses.append(await put(master, i))

                one.start_soon(put_one)
                size = 0
                while size == 0:  # heartbeats first, perhaps
                    offset, size = FRAME.unpack(await receive_exactly(slave, FRAME.size))
                    assert offset == at
                await receive_exactly(slave, size)
                at += size
                await slave.send_all(REPORT.pack(at))  # the slave's ack
        assert statuses == [OK] * 10
        await wait_until(lambda: seen[1] - before == flood_bytes,
                         "the master to read the whole flood", timeout=600)
        elapsed = trio.current_time() - started
        flood_rounds = seen[0] - rounds
        assert flood_rounds <= elapsed * FLOOD_READS_PER_SECOND + 2, (flood_rounds, elapsed)
        assert flood_connection in service.connections.values()  # still served
        nursery.cancel_scope.cancel()
