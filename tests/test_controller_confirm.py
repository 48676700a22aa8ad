"""Issue 38, two store-side rules of controller mode: consume queues built only up to the
confirm offset (``store/confirm.py``), and IN_SYNC_REPLICAS_NOT_ENOUGH for a master whose
in-sync set is smaller than minInSyncReplicas.

Two of our controller-mode stores over loopback, and raw slaves speaking the protocol where a
test must hold an ack back: a master shows consumers only what every member of its in-sync set
acknowledged; a slave builds its queues up to the confirm offset its master sends, and a
slave elected master shows its whole log; a master whose set shrank below minInSyncReplicas
refuses WAIT=true puts before anything is written, and a broker answers them SYSTEM_ERROR "in-sync
replicas not enough", as RocketMQ 5.3.3's does."""

from __future__ import annotations

import functools
import socket
import time

import trio
import trio.testing

from conftest import wait_until
from test_broker import send_request
from test_ha import body, master_config
from test_ha_autoswitch import (
    COPY_TIMEOUT,
    RawSlave,
    become_master,
    controller_config,
    copied,
    ha_addr,
)
from trio_ha import Message, PutMessageStatus, open_store
from trio_ha.broker import BrokerConfig, serve_broker
from trio_ha.broker.broker import Broker
from trio_ha.broker.send import send_reply
from trio_ha.remoting import open_remoting_client
from trio_ha.store import MessageStore, PutRequest
from trio_ha.store import controller_roles as croles
from trio_ha.store.ha.autoswitch_slave import AutoSwitchHAClient
from trio_ha.wire.remoting import ResponseCode

#: the HA heartbeat (ms) of the masters here: a slave hears a risen confirm offset with it
HEARTBEAT_MS = 100


async def unwaited_put(store: MessageStore, topic: str, payload: bytes, *,
                       keys: str | None = None) -> tuple[int, int]:
    """A WAIT=false put (answered at its append: nothing to wait for); (offset, end)."""
    message = Message(topic, payload, keys=keys)
    request = PutRequest.of_message(message)._replace(wait_store_msg_ok=False)
    result = await store.put(request)
    assert result.status is PutMessageStatus.PUT_OK, result
    return result.commitlog_offset, result.commitlog_offset + result.size


async def visible_bodies(store: MessageStore, topic: str) -> list[bytes]:
    return [m.body for m in await store.get_messages(topic, 0, 0, 100)]


async def settled(store: MessageStore) -> None:
    """Let every task of the test's loop run until none can: the dispatcher has done what it
    may, so what is not dispatched then is held back, not merely late."""
    await trio.testing.wait_all_tasks_blocked(cushion=0.05)
    assert store.dispatcher.cursor <= store.confirmed.value


async def heard_from_master(client: AutoSwitchHAClient) -> None:
    """Wait for a frame (a heartbeat, if nothing is written) the master sends from now on:
    it carries the master's confirm offset of that moment."""
    since = client.last_frame_time

    def heard() -> bool:
        last = client.last_frame_time
        return last is not None and (since is None or last > since)

    await wait_until(heard, "a frame from the master", timeout=COPY_TIMEOUT)


async def test_a_master_shows_consumers_only_what_its_in_sync_slave_acknowledged(tmp_path):
    """The set {1, 2}: a message the master has, and member 2 has received but not
    acknowledged, is in no consume queue, no max offset, no look-up and no query; once member
    2 acks it, every one of them shows it, and the waiting put is answered."""
    config = controller_config(tmp_path / "m", slave_timeout=20_000,
                               ha_send_heartbeat_interval=HEARTBEAT_MS)
    async with open_store(config) as master:
        await become_master(master, epoch=1, broker_id=1, members=frozenset({1, 2}))
        slave = await RawSlave.connect(master, broker_id=2)
        async with slave.stream:
            await slave.handshake(0)
            _, first_end = await unwaited_put(master, "Confirm", b"first", keys="k1")
            with trio.fail_after(COPY_TIMEOUT):
                await slave.receive_until(first_end)
            await settled(master)
            assert master.confirmed.value == 0 < first_end == master.commitlog.max_offset
            assert master.max_queue_offset("Confirm", 0) == 0
            assert await visible_bodies(master, "Confirm") == []
            assert await master.look_message_by_offset(0) is None
            assert master.max_commitlog_offset == 0
            now = int(time.time() * 1000)
            assert master.query_message("Confirm", "k1", 10, 0, now + 60_000).records == []
            # The frames tell slaves the same confirm offset.
            assert all(f.confirm_offset == 0 for f in slave.frames)

            await slave.ack(first_end)
            with trio.fail_after(COPY_TIMEOUT):
                await master.wait_dispatched(first_end)
            assert master.confirmed.value == first_end == master.max_commitlog_offset
            assert master.max_queue_offset("Confirm", 0) == 1
            assert await visible_bodies(master, "Confirm") == [b"first"]
            found = await master.look_message_by_offset(0)
            assert found is not None and found.body == b"first"
            query = master.query_message("Confirm", "k1", 10, 0, now + 60_000)
            assert len(query.records) == 1

            # A put that waits for the set: answered, and shown, only once member 2 acks.
            answered: list[PutMessageStatus] = []
            done = trio.Event()

            async def waited_put() -> None:
                result = await master.put_message(Message("Confirm", b"second"))
                answered.append(result.status)
                done.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(waited_put)
                with trio.fail_after(COPY_TIMEOUT):
                    await master.commitlog.written.wait_for(first_end + 1)
                    end = master.commitlog.max_offset
                    await slave.receive_until(end)
                await settled(master)
                assert not done.is_set()
                assert master.confirmed.value == first_end
                assert await visible_bodies(master, "Confirm") == [b"first"]
                await slave.ack(end)
                with trio.fail_after(COPY_TIMEOUT):
                    await done.wait()
                    await master.wait_dispatched(end)
            assert answered == [PutMessageStatus.PUT_OK]
            assert await visible_bodies(master, "Confirm") == [b"first", b"second"]


async def test_a_slave_builds_its_queues_up_to_its_masters_confirm_offset(tmp_path):
    """The set {1, 2, 3}: our store B (member 2) copies and acks at once, the raw member 3
    holds its ack back, so the master's confirm offset stays behind. B has the bytes but its
    queues stop at the offset its master sends; when member 3 acks, the master's next frame
    (a heartbeat here) raises it, and B's queues follow. Elected master with bytes its old
    master never confirmed, B shows its whole log: its set is itself alone."""
    master_config = controller_config(tmp_path / "a", ha_send_heartbeat_interval=HEARTBEAT_MS)
    async with open_store(master_config) as a, \
            open_store(controller_config(tmp_path / "b")) as b:
        await become_master(a, epoch=1, broker_id=1, members=frozenset({1, 2, 3}))
        holder = await RawSlave.connect(a, broker_id=3)
        async with holder.stream:
            await holder.handshake(0)
            await croles.change_to_slave(b, ha_addr(a), broker_id=2)
            client = b.ha_client
            assert isinstance(client, AutoSwitchHAClient)
            end = 0
            for i in range(5):
                _, end = await unwaited_put(a, "Follow", body(i))
            await copied(b, end)
            with trio.fail_after(COPY_TIMEOUT):
                await holder.receive_until(end)
            await heard_from_master(client)
            await settled(b)
            assert a.confirmed.value == 0 and client.confirm_offset == 0
            assert b.confirmed.value == 0 and b.max_queue_offset("Follow", 0) == 0
            assert await visible_bodies(b, "Follow") == []

            await holder.ack(end)
            with trio.fail_after(COPY_TIMEOUT):
                await a.wait_dispatched(end)
                await b.wait_dispatched(end)
            assert client.confirm_offset == end == b.confirmed.value
            assert await visible_bodies(b, "Follow") == [body(i) for i in range(5)]

            # More that member 3 never acks: B has it, and does not show it.
            more = end
            for i in range(5, 8):
                _, more = await unwaited_put(a, "Follow", body(i))
            await copied(b, more)
            await heard_from_master(client)
            await settled(b)
            assert b.confirmed.value == end
            assert b.max_queue_offset("Follow", 0) == 5

        # A's set loses its hold on B: B is elected (its set is {2}) and shows all it has.
        await become_master(b, epoch=2, broker_id=2)
        assert b.confirmed.value == more == b.commitlog.max_offset
        assert await visible_bodies(b, "Follow") == [body(i) for i in range(8)]
        _, after = await unwaited_put(b, "Follow", b"the new master's")
        with trio.fail_after(COPY_TIMEOUT):
            await b.wait_dispatched(after)
        assert (await visible_bodies(b, "Follow"))[-1] == b"the new master's"


async def test_a_set_below_min_in_sync_replicas_refuses_puts_that_wait(tmp_path):
    """minInSyncReplicas=2, the set {1, 2}: puts are answered while member 2 is there. It
    goes, the controller accepts the set {1}: a WAIT=true put, or batch, is refused with
    IN_SYNC_REPLICAS_NOT_ENOUGH before anything is written (a broker answers SYSTEM_ERROR
    "in-sync replicas not enough"); a WAIT=false put is taken, as RocketMQ's CommitLog takes
    it. When the set holds two again, puts are answered again."""
    config = controller_config(tmp_path / "m", min_in_sync_replicas=2, slave_timeout=10_000)
    async with open_store(config) as master:
        term = await become_master(master, epoch=1, broker_id=1, members=frozenset({1, 2}))
        state = term.sync_state
        async with open_store(controller_config(tmp_path / "s")) as slave:
            await croles.change_to_slave(slave, ha_addr(master), broker_id=2)
            result = await master.put_message(Message("Gate", b"with member 2"))
            assert result.status is PutMessageStatus.PUT_OK, result
        # Member 2 is gone; the link proposes the shrink, and the controller accepts it.
        await wait_until(lambda: not state.links(), "member 2's connection to end",
                         timeout=COPY_TIMEOUT)
        state.tick(trio.current_time())
        proposal = state.take_proposal(trio.current_time())
        assert proposal is not None and proposal.members == frozenset({1})
        state.accepted(proposal.members, proposal.epoch + 1, trio.current_time())
        master.raise_replicated()
        assert not state.admits_puts

        end = master.commitlog.max_offset
        refused = await master.put_message(Message("Gate", b"alone"))
        assert refused.status is PutMessageStatus.IN_SYNC_REPLICAS_NOT_ENOUGH
        assert not refused.status.stored
        assert refused.remark == "in-sync replicas not enough"
        batch = await master.put_messages([Message("Gate", b"one"), Message("Gate", b"two")])
        assert batch.status is PutMessageStatus.IN_SYNC_REPLICAS_NOT_ENOUGH
        assert master.commitlog.max_offset == end  # nothing of either was written

        reply = send_reply(send_request("Gate", b"alone"), refused, 0)
        assert not isinstance(reply, bytes)
        assert reply.code == ResponseCode.SYSTEM_ERROR
        assert reply.remark == "in-sync replicas not enough"

        _, unwaited_end = await unwaited_put(master, "Gate", b"WAIT=false")
        assert unwaited_end > end

        # Member 2 comes back and the controller's set names it again.
        async with open_store(controller_config(tmp_path / "s")) as slave:
            await croles.change_to_slave(slave, ha_addr(master), broker_id=2)
            await copied(slave, unwaited_end)
            state.controller_set(frozenset({1, 2}), proposal.epoch + 2, trio.current_time())
            master.raise_replicated()
            assert state.admits_puts
            result = await master.put_message(Message("Gate", b"with member 2 again"))
            assert result.status is PutMessageStatus.PUT_OK, result
            with trio.fail_after(COPY_TIMEOUT):
                await master.wait_dispatched()
            assert await visible_bodies(master, "Gate") == [
                b"with member 2", b"WAIT=false", b"with member 2 again"]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_a_broker_answers_system_error_in_sync_replicas_not_enough(nursery, tmp_path):
    """A controller-mode broker made master with the set {1} and minInSyncReplicas=2 answers
    a send SYSTEM_ERROR "in-sync replicas not enough" (RocketMQ 5.3.3's
    SendMessageProcessor); a send with WAIT=false is stored. (Its controller is not there:
    the broker keeps trying to register meanwhile, which changes nothing here.)"""
    properties = {
        "brokerClusterName": "c1", "brokerName": "gate", "listenPort": "0",
        "bindAddress": "127.0.0.1", "brokerIP1": "127.0.0.1", "haBindAddress": "127.0.0.1",
        "storePathRootDir": str(tmp_path / "broker"), "mappedFileSizeCommitLog": "65536",
        "enableControllerMode": "true", "controllerAddr": f"127.0.0.1:{_closed_port()}",
        "minInSyncReplicas": "2",
    }
    brokers: list[Broker] = []
    await nursery.start(functools.partial(serve_broker, BrokerConfig.from_properties(properties),
                                          on_serving=brokers.append))
    [broker] = brokers
    await broker.change_to_controller_master(1, 1, frozenset({1}), 1)
    async with open_remoting_client(broker.addresses.broker_addr) as client:
        reply = await client.invoke(send_request("Gate", b"refused"), 5)
        assert reply.code == ResponseCode.SYSTEM_ERROR
        assert reply.remark == "in-sync replicas not enough"
        stored = await client.invoke(send_request("Gate", b"taken", props="WAIT\x01false"), 5)
        assert stored.code == ResponseCode.SUCCESS, stored.remark
    with trio.fail_after(COPY_TIMEOUT):
        await broker.store.wait_dispatched()
    assert [m.body for m in await broker.store.get_messages("Gate", 0, 0, 10)] == [b"taken"]


async def test_a_classic_store_keeps_no_confirm_offset(tmp_path):
    """A classic store's readers and dispatcher follow its log as before: no confirm
    offset, no in-sync gate (its puts keep their fast path)."""
    async with open_store(master_config(tmp_path / "c")) as store:
        assert store.confirm is None
        assert store.confirmed is store.commitlog.written is store.log_mark
        _, end = await unwaited_put(store, "Classic", b"seen at once")
        with trio.fail_after(COPY_TIMEOUT):
            await store.wait_dispatched(end)
        assert await visible_bodies(store, "Classic") == [b"seen at once"]
