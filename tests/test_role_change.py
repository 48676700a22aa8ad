"""Issue 38, role changes at run time: a store, and a broker, change between master and slave
without a restart (RocketMQ 5's ``changeToMaster`` / ``changeToSlave``; spec
``controller-mode.md`` §2.4), over the classic HA protocol.

The store alone first (a torn tail cut, puts waiting for a slave answered once, a switch
both ways), then two of our brokers behind our name server: master A and slave B swap
roles, and swap back."""

import functools
import os
from typing import Any

import pytest
import trio

from conftest import ha_of, wait_until
from test_broker import send_request, send_until_replicated
from test_ha import SEGMENT, body, master_config
from trio_ha import (
    BrokerRole,
    FlushDiskType,
    Message,
    PutMessageStatus,
    StoreConfig,
    open_store,
)
from trio_ha.broker import BrokerConfig, serve_broker
from trio_ha.broker.broker import Broker
from trio_ha.namesrv import serve_namesrv
from trio_ha.remoting import open_remoting_client
from trio_ha.store import MessageStore, RoleChangeError
from trio_ha.testing import ClusterConfig
from trio_ha.wire.record import encode_blank
from trio_ha.wire.remoting import RemotingCommand, RequestCode, ResponseCode
from trio_ha.wire.route import RegisterBrokerBody, TopicRouteData


def replica_config(root, **overrides) -> StoreConfig:
    """A slave that knows no master yet, with an HA port of its own (to serve as master)."""
    values: dict[str, Any] = dict(
        store_path_root_dir=str(root), mapped_file_size_commit_log=SEGMENT,
        mapped_file_size_consume_queue=20 * 200, broker_role=BrokerRole.SLAVE,
        ha_listen_port=0, ha_bind_address="127.0.0.1", ha_reconnect_interval=100,
        slave_timeout=2000,
    )
    values.update(overrides)
    return StoreConfig(**values)


def ha_addr(store: MessageStore) -> str:
    assert store.ha_address is not None
    host, port = store.ha_address
    return f"{host}:{port}"


async def bodies(store: MessageStore, topic: str, queue: int = 0) -> list[bytes]:
    await store.wait_dispatched()
    return [m.body for m in await store.get_messages(topic, queue, 0, 1000)]


# ---- the store -------------------------------------------------------------------------------


@pytest.mark.parametrize("flush", [FlushDiskType.ASYNC_FLUSH, FlushDiskType.SYNC_FLUSH])
async def test_a_slave_with_a_torn_tail_becomes_a_master_that_appends_after_its_last_record(
        tmp_path, flush):
    """A slave receives byte ranges, not records: the master died with half a record sent.
    Becoming master zeroes that half and closes the segment there, and the next put goes to
    the next segment, with the next queue offset, and is dispatched (and, under SYNC_FLUSH,
    flushed: nothing waits for an offset past the torn bytes); a restart finds the log
    clean."""
    async with open_store(master_config(tmp_path / "m", broker_role=BrokerRole.ASYNC_MASTER)) \
            as old:
        sent = [body(i) for i in range(9)] + [b"a long one " * 200]
        results = [await old.put_message(Message("Torn", payload)) for payload in sent]
        end9 = results[9].commitlog_offset
        log = old.commitlog.read(0, old.max_commitlog_offset)
    torn_at = end9 + results[9].size // 2
    async with open_store(replica_config(tmp_path / "s", flush_disk_type=flush)) as store:
        assert store.role is BrokerRole.SLAVE and store.ha_client is not None
        await store.commitlog.append_replica(0, log[:torn_at])
        await store.wait_dispatched(end9)
        refused = await store.put_message(Message("Torn", b"not yet"))
        assert refused.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        await store.change_to_master(BrokerRole.ASYNC_MASTER)
        assert store.role is BrokerRole.ASYNC_MASTER and store.ha_client is None
        assert store.max_commitlog_offset == SEGMENT
        # the sealed segment is flushed to its end as the change returns (under SYNC_FLUSH
        # readers see flushed bytes only), not when the next put's flush comes by
        assert store.commitlog.flushed.value == SEGMENT
        sealed = store.commitlog.segments.segments[0]
        # the blank record's header (TOTALSIZE, BLANK_MAGIC), then zeros where the half was
        assert sealed.read(end9, 8) == encode_blank(SEGMENT - end9)
        assert sealed.read(end9 + 8, torn_at - end9 - 8) == bytes(torn_at - end9 - 8)
        new = await store.put_message(Message("Torn", b"first of the new master"))
        assert new.status is PutMessageStatus.PUT_OK
        assert (new.commitlog_offset, new.queue_offset) == (SEGMENT, 9)
        assert await bodies(store, "Torn") == sent[:9] + [b"first of the new master"]
    async with open_store(replica_config(tmp_path / "s", broker_role=BrokerRole.ASYNC_MASTER,
                                         flush_disk_type=flush)) as reopened:
        assert reopened.recovery is not None and not reopened.recovery.abnormal
        assert reopened.max_commitlog_offset == SEGMENT + new.size
        assert await bodies(reopened, "Torn") == sent[:9] + [b"first of the new master"]


async def test_an_empty_slave_becomes_a_master_with_a_first_segment(tmp_path):
    async with open_store(replica_config(tmp_path / "s")) as store:
        assert not store.commitlog.segments.segments
        await store.change_to_master()
        result = await store.put_message(Message("Fresh", b"x"))
        # a SYNC_MASTER with no slave attached says so, and stored the message
        assert result.status is PutMessageStatus.SLAVE_NOT_AVAILABLE
        assert result.commitlog_offset == 0 and await bodies(store, "Fresh") == [b"x"]


async def test_puts_in_flight_when_a_master_becomes_slave_are_answered_once_and_honestly(
        tmp_path):
    """Many puts run while the SYNC_MASTER becomes a slave: each is answered once — PUT_OK
    only if the slave holds it, SERVICE_NOT_AVAILABLE (not stored) after the change, or a
    replica status for one stored but not acknowledged."""
    async with open_store(master_config(tmp_path / "a")) as a, \
            open_store(replica_config(tmp_path / "b", ha_master_address=None)) as b:
        assert b.ha_client is not None
        b.ha_client.update_master_address(ha_addr(a))
        await wait_until(lambda: any(c.acked_offset is not None for c in ha_of(a).connections),
                         "the slave to attach")
        answers: dict[bytes, PutMessageStatus] = {}

        async def putter(worker: int) -> None:
            for i in range(200):
                payload = f"w{worker}-{i}".encode()
                assert payload not in answers
                answers[payload] = (await a.put_message(Message("Flight", payload))).status
                if answers[payload] is PutMessageStatus.SERVICE_NOT_AVAILABLE:
                    return

        async with trio.open_nursery() as nursery:
            for worker in range(4):
                nursery.start_soon(putter, worker)
            await wait_until(lambda: len(answers) >= 40, "puts to be answered")
            await a.change_to_slave(ha_addr(b))
        assert a.role is BrokerRole.SLAVE and a.group_transfer is None
        statuses = set(answers.values())
        assert PutMessageStatus.SERVICE_NOT_AVAILABLE in statuses
        assert statuses <= {PutMessageStatus.PUT_OK, PutMessageStatus.SERVICE_NOT_AVAILABLE,
                            PutMessageStatus.FLUSH_SLAVE_TIMEOUT}
        await b.change_to_master()
        on_b = await bodies(b, "Flight")
        assert len(on_b) == len(set(on_b))
        on_a = await bodies(a, "Flight")
        for payload, status in answers.items():
            if status is PutMessageStatus.PUT_OK:
                assert payload in on_b, payload
            if status is PutMessageStatus.SERVICE_NOT_AVAILABLE:
                assert payload not in on_a, payload


async def test_two_stores_swap_roles_and_swap_back(tmp_path):
    async with open_store(master_config(tmp_path / "a")) as a, \
            open_store(replica_config(tmp_path / "b")) as b:
        assert b.ha_client is not None
        b.ha_client.update_master_address(ha_addr(a))
        await wait_until(lambda: any(c.acked_offset is not None for c in ha_of(a).connections),
                         "the slave to attach")
        first = [await a.put_message(Message("Swap", body(i))) for i in range(30)]
        assert {r.status for r in first} == {PutMessageStatus.PUT_OK}
        for old, new, tag in ((a, b, "b"), (b, a, "a")):
            await old.change_to_slave(ha_addr(new))
            await new.change_to_master()
            refused = await old.put_message(Message("Swap", b"to the slave"))
            assert refused.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
            # The new master's puts wait for the old one, now its slave, to hold them.
            result = await wait_until(functools.partial(_acked_put, new, f"on {tag}"),
                                      "the old master to attach as slave")
            assert result.commitlog_offset >= first[-1].commitlog_offset
            await old.wait_dispatched(new.max_commitlog_offset)
            assert await bodies(old, "Swap") == await bodies(new, "Swap")
        final = await bodies(a, "Swap")
        assert final[:30] == [body(i) for i in range(30)]
        assert set(final[30:]) == {b"on b", b"on a"}
        assert a.role is BrokerRole.SYNC_MASTER and b.role is BrokerRole.SLAVE


async def _acked_put(store: MessageStore, payload: str):
    result = await store.put_message(Message("Swap", payload.encode()))
    return result if result.status is PutMessageStatus.PUT_OK else None


# ---- two brokers ------------------------------------------------------------------------------

PROPERTIES = {"haReconnectInterval": 100, "slaveTimeout": 2000,
              "messageDelayLevel": "1s 2s 4s"}


async def start_pair(nursery: trio.Nursery, tmp_path) -> tuple[str, Broker, Broker]:
    """Our name server, master A (SYNC_MASTER, id 0) and slave B (id 1), as live Brokers."""
    config = ClusterConfig(data_dir=tmp_path / "pair", properties=PROPERTIES)
    os.makedirs(config.data_dir, exist_ok=True)
    _, port = await nursery.start(serve_namesrv, config.namesrv_config())
    namesrv = f"127.0.0.1:{port}"
    brokers: list[Broker] = []
    for broker_id in (0, 1):
        broker_config = BrokerConfig.from_properties(config.broker_properties(broker_id, namesrv))
        await nursery.start(functools.partial(serve_broker, broker_config,
                                              on_serving=brokers.append))
    return namesrv, brokers[0], brokers[1]


async def switch(old: Broker, new: Broker, *, epoch: int, old_id: int) -> None:
    """What a controller asks after an election that made ``new`` the master."""
    await old.change_to_slave(new.addresses.broker_addr, new.addresses.ha_addr, old_id, epoch)
    await new.change_to_master(epoch)


async def test_two_brokers_swap_roles_at_run_time_and_swap_back(nursery, tmp_path):
    namesrv, a, b = await start_pair(nursery, tmp_path)
    assert not a.is_slave and b.is_slave
    async with open_remoting_client(a.addresses.broker_addr) as to_a, \
            open_remoting_client(b.addresses.broker_addr) as to_b:
        # (until B attaches, A answers SLAVE_NOT_AVAILABLE and stores each try)
        await send_until_replicated(to_a, "Roles", b"before")
        acked = []
        for i in range(20):
            reply = await to_a.invoke(send_request("Roles", f"before {i}".encode()), 5)
            assert reply.code == ResponseCode.SUCCESS, reply.remark
            acked.append(f"before {i}".encode())
        # Due 4 s after it is stored, after the switch: the new master delivers it.
        reply = await to_a.invoke(send_request("Later", b"late", props="DELAY\x013"), 5)
        assert reply.code == ResponseCode.SUCCESS, reply.remark

        # Sends keep coming while the roles change: each gets one answer.
        in_flight: dict[bytes, int] = {}

        async def sender(worker: int) -> None:
            for i in range(10_000):
                payload = f"flight {worker}-{i}".encode()
                reply = await to_a.invoke(send_request("Roles", payload), 5)
                assert payload not in in_flight
                in_flight[payload] = reply.code
                if reply.code == ResponseCode.SERVICE_NOT_AVAILABLE:
                    return

        async with trio.open_nursery() as senders:
            for worker in range(3):
                senders.start_soon(sender, worker)
            await wait_until(lambda: len(in_flight) >= 30, "sends in flight")
            await switch(a, b, epoch=1, old_id=2)
        assert a.is_slave and not b.is_slave
        assert set(in_flight.values()) <= {ResponseCode.SUCCESS,
                                           ResponseCode.SERVICE_NOT_AVAILABLE,
                                           ResponseCode.FLUSH_SLAVE_TIMEOUT}

        # The old master refuses sends as a slave does; the new one takes them, and they
        # reach the old master, which now copies from it.
        refused = await to_a.invoke(send_request("Roles", b"to a slave"), 5)
        assert refused.code == ResponseCode.SERVICE_NOT_AVAILABLE, refused.remark
        await send_until_replicated(to_b, "Roles", b"after")
        on_b = await bodies(b.store, "Roles")
        assert b"before" in on_b and b"after" in on_b
        for payload in acked + [p for p, code in in_flight.items()
                                if code == ResponseCode.SUCCESS]:
            assert on_b.count(payload) == 1, payload
        for payload, code in in_flight.items():
            if code == ResponseCode.SERVICE_NOT_AVAILABLE:
                assert payload not in on_b, payload
        await a.store.wait_dispatched(b.store.max_commitlog_offset)
        assert await bodies(a.store, "Roles") == await bodies(b.store, "Roles")

        # The delayed message: delivered once, by the new master (the old one's copy is
        # B's, replicated: the logs are the same).
        await wait_until(lambda: b.store.max_queue_offset("Later", 0) > 0,
                         "the new master to deliver the delayed message", timeout=15)
        await b.store.wait_dispatched()
        [delivered] = await b.store.get_messages("Later", 0, 0, 10)
        assert delivered.body == b"late"
        assert delivered.store_host == b.addresses.broker_addr  # B stored it, not A
        await a.store.wait_dispatched(b.store.max_commitlog_offset)
        assert await bodies(a.store, "Later") == [b"late"]

        # And back.
        await switch(b, a, epoch=2, old_id=1)
        assert not a.is_slave and b.is_slave
        refused = await to_b.invoke(send_request("Roles", b"to b, a slave again"), 5)
        assert refused.code == ResponseCode.SERVICE_NOT_AVAILABLE, refused.remark
        await send_until_replicated(to_a, "Roles", b"back")
        on_a = await bodies(a.store, "Roles")
        assert on_a[: len(on_b)] == on_b and b"back" in on_a
        await b.store.wait_dispatched(a.store.max_commitlog_offset)
        assert await bodies(b.store, "Roles") == on_a


async def test_the_name_server_routes_to_the_new_master_at_id_0(nursery, tmp_path):
    namesrv, a, b = await start_pair(nursery, tmp_path)
    async with open_remoting_client(a.addresses.broker_addr) as to_a:
        await send_until_replicated(to_a, "Routed")
    await switch(a, b, epoch=7, old_id=2)

    async def route() -> dict[int, str]:
        async with open_remoting_client(namesrv) as ns:
            reply = await ns.invoke(RemotingCommand.request(
                RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Routed"}), 5)
        assert reply.code == ResponseCode.SUCCESS, reply.remark
        return TopicRouteData.decode(reply.body).broker_datas[0].broker_addrs

    expected = {0: b.addresses.broker_addr, 2: a.addresses.broker_addr}
    await wait_until(lambda: _is(route(), expected), "the route to name B as master")
    # Each registers with the epoch as its state version, and its new id.
    for broker, broker_id in ((b, 0), (a, 2)):
        request = broker.registration.register_request()
        assert request.field_long("brokerId") == broker_id
        sent = RegisterBrokerBody.decode(request.body)
        assert sent.data_version.state_version == 7 == broker.state_version
    # The old master copies from the new one, as the name server also says.
    assert a.store.ha_client is not None
    assert a.store.ha_client.master_address == b.addresses.ha_addr
    await wait_until(lambda: a.master_addr == b.addresses.broker_addr,
                     "the old master to learn the new one's address from the name server")


async def _is(value, expected) -> bool:
    return await value == expected


async def test_a_change_to_an_older_epoch_is_refused(nursery, tmp_path):
    _, a, b = await start_pair(nursery, tmp_path)
    await switch(a, b, epoch=5, old_id=2)
    with pytest.raises(RoleChangeError, match="older"):
        await b.change_to_slave(a.addresses.broker_addr, a.addresses.ha_addr, 1, 4)
    assert not b.is_slave and b.state_version == 5
