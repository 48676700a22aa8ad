"""Issue 35, defect 5, on a master's HA port: one peer (or a few) must not deny replication to
the real slave.

(a) Without haAuthSecret, 16 peers that ask for the log end and restate it held every HA slot
    (haMaxConnections) for as long as they stayed, and the real slave was refused. Now a
    connection that has not acknowledged a byte it carried (not *proven*) makes way for a
    newcomer, the longest-unproven first, and a proven slave never does.

Everything runs over real loopback sockets against a real store; no test asserts a duration.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import trio

from conftest import ha_of, wait_until
from trio_ha import BrokerRole, Message, PutMessageStatus, StoreConfig, open_store
from trio_ha.chaos import hostile
from trio_ha.store import MessageStore

SEGMENT = 64 * 1024
OK = PutMessageStatus.PUT_OK

_CHILD_PATH = Path(__file__).with_name("ha_slave_process.py")
_spec = importlib.util.spec_from_file_location("ha_slave_process", _CHILD_PATH)
assert _spec is not None and _spec.loader is not None
ha_slave_process = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ha_slave_process)


def master_config(root, **overrides) -> StoreConfig:
    values: dict[str, Any] = dict(
        store_path_root_dir=str(root), mapped_file_size_commit_log=SEGMENT,
        mapped_file_size_consume_queue=20 * 200, broker_role=BrokerRole.SYNC_MASTER,
        ha_listen_port=0, ha_bind_address="127.0.0.1", slave_timeout=1000,
        ha_housekeeping_interval=30_000, ha_send_heartbeat_interval=100,
    )
    values.update(overrides)
    return StoreConfig(**values)


def ha_address(master: MessageStore) -> str:
    assert master.ha_address is not None
    return f"{master.ha_address[0]}:{master.ha_address[1]}"


def max_offset(store: MessageStore) -> int:
    return store.statistics().max_commitlog_offset


async def put(master: MessageStore, i: int) -> PutMessageStatus:
    return (await master.put_message(Message("Slots", b"%d" % i * 50))).status


async def test_defect_5a_sixteen_squatters_restating_the_log_end_cannot_keep_the_real_slave_out(
    tmp_path,
):
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
            nursery.cancel_scope.cancel()
