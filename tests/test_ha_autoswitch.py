"""Issue 38, the AutoSwitch HA protocol's trio adapters: two of our controller-mode stores over
real loopback sockets (``store/ha/autoswitch_master.py``, ``autoswitch_slave.py``,
``store/controller_roles.py``), and raw peers speaking the protocol (``wire.ha_autoswitch``)
where a test must see the frames or misbehave.

A slave copies a master; an old master that wrote what the new master never had rejoins as
its slave, cuts its log back to the point their epochs share and copies on, ending
byte-identical; frames never cross an epoch boundary; a SYNC_MASTER put waits for every
member of the in-sync set; a hostile peer loses its connection, and only that."""

from __future__ import annotations

import struct
from typing import Any

import trio

from conftest import wait_until
from test_ha import SEGMENT, body
from trio_ha import BrokerRole, Message, PutMessageStatus, StoreConfig, open_store
from trio_ha.store import MessageStore
from trio_ha.store import controller_roles as croles
from trio_ha.store.ha.autoswitch_slave import AutoSwitchHAClient
from trio_ha.store.ha.epochs import EpochEntry, EpochFile
from trio_ha.wire.ha_autoswitch import (
    NEED_DATA,
    AutoSwitchSlaveProtocol,
    FrameData,
    FrameEnd,
    HandshakeReply,
    TransferHeader,
)

#: generous bounds for loopback copies on a busy 2-core machine
COPY_TIMEOUT = 20.0


def controller_config(root, **overrides) -> StoreConfig:
    """A controller-mode store as a broker starts it: fenced (a slave with no master), with
    an HA port of its own for when it becomes master."""
    values: dict[str, Any] = dict(
        store_path_root_dir=str(root), mapped_file_size_commit_log=SEGMENT,
        mapped_file_size_consume_queue=20 * 200, broker_role=BrokerRole.SLAVE,
        ha_listen_port=0, ha_bind_address="127.0.0.1", ha_reconnect_interval=100,
        slave_timeout=2000, enable_controller_mode=True,
    )
    values.update(overrides)
    return StoreConfig(**values)


def ha_addr(store: MessageStore) -> str:
    assert store.ha_address is not None
    host, port = store.ha_address
    return f"{host}:{port}"


async def become_master(store: MessageStore, epoch: int, broker_id: int,
                        members: frozenset[int] | None = None, set_epoch: int = 1):
    return await croles.change_to_master(
        store, epoch=epoch, broker_id=broker_id,
        sync_state_set=members or frozenset({broker_id}), sync_state_set_epoch=set_epoch)


async def put(store: MessageStore, topic: str, payload: bytes) -> int:
    """Put one message; the log's end after it (PUT_OK asserted)."""
    result = await store.put_message(Message(topic, payload))
    assert result.status is PutMessageStatus.PUT_OK, result
    return result.commitlog_offset + result.size


async def copied(slave: MessageStore, end: int) -> None:
    with trio.fail_after(COPY_TIMEOUT):
        await slave.commitlog.written.wait_for(end)


def log_bytes(store: MessageStore, end: int) -> bytes:
    return bytes(store.commitlog.read(0, end))


def history(store: MessageStore) -> tuple[EpochEntry, ...]:
    """The epoch history on disk (what a restart finds)."""
    return EpochFile.load(store.config.epoch_file_path).cache.entries


async def test_a_slave_copies_its_master_and_its_epochs(tmp_path):
    async with open_store(controller_config(tmp_path / "a")) as a, \
            open_store(controller_config(tmp_path / "b")) as b:
        await become_master(a, epoch=1, broker_id=1)
        end = 0
        for i in range(20):
            end = await put(a, "Copy", body(i))
        await croles.change_to_slave(b, ha_addr(a), broker_id=2)
        assert isinstance(b.ha_client, AutoSwitchHAClient)
        await copied(b, end)
        for i in range(20, 30):  # and what comes while it is attached
            end = await put(a, "Copy", body(i))
        await copied(b, end)
        assert log_bytes(b, end) == log_bytes(a, end)
        assert history(b) == history(a) == (EpochEntry(1, 0),)
        await b.wait_dispatched(end)
        got = [m.body for m in await b.get_messages("Copy", 0, 0, 100)]
        assert got == [body(i) for i in range(30)]


async def test_an_old_master_rejoins_cuts_what_the_new_master_never_had_and_copies_on(
        tmp_path):
    """A (epoch 1) is copied by B up to Y; B is elected (epoch 2 at Y) and writes; A, not
    told yet, writes past Y too. A rejoins as B's slave: their epochs agree on epoch 1 up to
    Y, so A cuts its own tail back to Y and copies B's epoch 2: both logs end identical."""
    async with open_store(controller_config(tmp_path / "a")) as a, \
            open_store(controller_config(tmp_path / "b")) as b:
        await become_master(a, epoch=1, broker_id=1)
        shared_end = a_end = b_end = 0
        for i in range(10):
            shared_end = await put(a, "Fail", body(i))
        await croles.change_to_slave(b, ha_addr(a), broker_id=2)
        await copied(b, shared_end)

        await become_master(b, epoch=2, broker_id=2)
        assert history(b) == (EpochEntry(1, 0), EpochEntry(2, shared_end))
        for i in range(5):  # only the old master has these
            a_end = await put(a, "Fail", b"lost " + body(i))
        for i in range(7):
            b_end = await put(b, "Fail", b"kept " + body(i))
        assert a_end > shared_end and b_end > shared_end

        await croles.change_to_slave(a, ha_addr(b), broker_id=1)
        client = a.ha_client
        assert isinstance(client, AutoSwitchHAClient)
        # (A's log is longer than B's at first: wait for the cut, then for the copy.)
        await wait_until(lambda: client.truncated_bytes, "the old master's cut",
                         timeout=COPY_TIMEOUT)
        await copied(a, b_end)
        assert client.consistent_point == shared_end
        assert client.truncated_bytes == a_end - shared_end
        assert a.commitlog.max_offset == b_end
        assert log_bytes(a, b_end) == log_bytes(b, b_end)
        assert history(a) == history(b)
        await a.wait_dispatched(b_end)
        got = [m.body for m in await a.get_messages("Fail", 0, 0, 100)]
        assert got == [body(i) for i in range(10)] + [b"kept " + body(i) for i in range(7)]


def master_connections(master: MessageStore):
    stats = master.statistics().ha
    assert stats is not None
    return stats.connections


# ---- raw peers --------------------------------------------------------------------------------


class RawSlave:
    """A slave made of the wire protocol and a socket, for tests that must see the frames."""

    def __init__(self, stream: trio.SocketStream, broker_id: int) -> None:
        self.stream = stream
        self.protocol = AutoSwitchSlaveProtocol(broker_id)
        self.frames: list[TransferHeader] = []
        self.end = 0

    @classmethod
    async def connect(cls, store: MessageStore, broker_id: int) -> RawSlave:
        host, port = store.ha_address or ("", 0)
        return cls(await trio.open_tcp_stream(host, port), broker_id)

    async def handshake(self, request: int = 0) -> HandshakeReply:
        await self.stream.send_all(self.protocol.send_handshake())
        while True:
            event = self.protocol.next_event()
            if isinstance(event, HandshakeReply):
                break
            data = await self.stream.receive_some(65536)
            assert data, "the master closed the connection during the handshake"
            self.protocol.receive_data(data)
        self.protocol.start_transfer(request)
        await self.ack(request)
        self.end = request
        return event

    async def ack(self, offset: int) -> None:
        await self.stream.send_all(self.protocol.send_ack(offset))

    async def receive_until(self, end: int) -> None:
        """Take frames until the log up to ``end`` came."""
        while self.end < end:
            event = self.protocol.next_event()
            if event is NEED_DATA:
                data = await self.stream.receive_some(65536)
                assert data, "the master closed the connection"
                self.protocol.receive_data(data)
            elif isinstance(event, TransferHeader) and not event.is_heartbeat:
                self.frames.append(event)
            elif isinstance(event, FrameEnd):
                self.end = event.offset + event.size
            else:
                assert isinstance(event, TransferHeader | FrameData)

    async def closed_by_master(self) -> bool:
        """Whether the master closes this connection (within a few seconds)."""
        with trio.move_on_after(5):
            try:
                while await self.stream.receive_some(65536):
                    pass
            except trio.BrokenResourceError:
                pass
            return True
        return False


async def test_a_frame_never_crosses_an_epoch_boundary(tmp_path):
    """The master was elected twice (epoch 1 at 0, epoch 2 at Y): a slave copying from 0 is
    sent frames that end at Y and start again there, each labelled with the epoch that
    wrote its bytes, though one frame could carry all of it."""
    async with open_store(controller_config(tmp_path / "m")) as master:
        await become_master(master, epoch=1, broker_id=1)
        boundary = end = 0
        for i in range(10):
            boundary = await put(master, "Epochs", body(i))
        await become_master(master, epoch=2, broker_id=1)
        for i in range(10):
            end = await put(master, "Epochs", body(i))
        assert end - 0 < master.config.ha_transfer_batch_size
        slave = await RawSlave.connect(master, broker_id=2)
        async with slave.stream:
            reply = await slave.handshake(0)
            assert [(e.epoch, e.start_offset) for e in reply.epochs] == [(1, 0), (2, boundary)]
            with trio.fail_after(COPY_TIMEOUT):
                await slave.receive_until(end)
        spans = [(f.offset, f.offset + f.size, f.epoch) for f in slave.frames]
        assert spans[0][0] == 0 and spans[-1][1] == end
        for start, stop, epoch in spans:
            assert stop <= boundary or start >= boundary, spans
            assert epoch == (1 if start < boundary else 2), spans
        assert any(stop == boundary for _, stop, _ in spans)


async def test_a_sync_master_put_waits_for_every_member_of_the_in_sync_set(tmp_path):
    """allAckInSyncStateSet (our default): with the set {1, 2} a put is answered only once
    member 2 acked its bytes, though they reached it before, and though a slave outside the
    set (3) acked them first."""
    async with open_store(controller_config(tmp_path / "m", slave_timeout=10_000)) as master:
        await become_master(master, epoch=1, broker_id=1, members=frozenset({1, 2}))
        assert master.config.all_ack_in_sync_state_set
        slave = await RawSlave.connect(master, broker_id=2)
        outsider = await RawSlave.connect(master, broker_id=3)
        async with slave.stream, outsider.stream:
            await slave.handshake(0)
            await outsider.handshake(0)
            answers: list[PutMessageStatus] = []
            answered = trio.Event()

            async def put_one() -> None:
                result = await master.put_message(Message("Sync", b"wait for member 2"))
                answers.append(result.status)
                answered.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(put_one)
                with trio.fail_after(COPY_TIMEOUT):
                    await master.commitlog.written.wait_for(1)
                    end = master.commitlog.max_offset
                    await slave.receive_until(end)
                    await outsider.receive_until(end)
                await outsider.ack(end)
                await wait_until(lambda: any(c.confirmed_offset == end
                                             for c in master_connections(master)),
                                 "the outsider's ack", timeout=COPY_TIMEOUT)
                assert not answered.is_set()  # member 2 has the bytes but has not acked
                await slave.ack(end)
                with trio.fail_after(COPY_TIMEOUT):
                    await answered.wait()
            assert answers == [PutMessageStatus.PUT_OK]


async def test_a_slave_of_an_empty_log_is_wanted_in_the_in_sync_set_and_a_claim_is_not(
        tmp_path):
    """An empty log has nothing a slave could lack: a slave attached to it is caught up, and
    the master wants it in the set though no byte was carried (RocketMQ grows the set on its
    ack of 0). Once the log has bytes, a peer whose request claims the log's end is not
    wanted until it acks bytes it was sent."""
    async with open_store(controller_config(tmp_path / "m")) as master, \
            open_store(controller_config(tmp_path / "s")) as empty_slave:
        term = await become_master(master, epoch=1, broker_id=1)
        sync_state = term.sync_state
        await croles.change_to_slave(empty_slave, ha_addr(master), broker_id=2)

        def caught_up() -> bool:
            replica = sync_state.replica(2)
            return replica is not None and replica.caught_up is not None

        await wait_until(caught_up, "the empty slave's request", timeout=COPY_TIMEOUT)
        proposal = sync_state.take_proposal(trio.current_time())
        assert proposal is not None and proposal.members == frozenset({1, 2})
        end = await put(master, "Claim", b"a byte to lack")
        claimant = await RawSlave.connect(master, broker_id=3)
        async with claimant.stream:
            await claimant.handshake(end)  # "my log ends where yours does"
            await wait_until(lambda: any(c.start_offset == end
                                         for c in master_connections(master)),
                             "the claim's request", timeout=COPY_TIMEOUT)
            replica = sync_state.replica(3)
            assert replica is not None and replica.link is not None
            assert replica.link.acked is None and replica.caught_up is None


async def test_a_hostile_peer_loses_its_connection_and_nothing_else(tmp_path):
    async with open_store(controller_config(tmp_path / "m")) as master:
        await become_master(master, epoch=1, broker_id=1)
        end = await put(master, "Hostile", b"before")

        # A handshake whose flags are neither 0 nor 1.
        garbage = await RawSlave.connect(master, broker_id=2)
        async with garbage.stream:
            await garbage.stream.send_all(struct.pack(">ihhq", 1, 7, 9, 2))
            assert await garbage.closed_by_master()

        # The master's own brokerId.
        impostor = await RawSlave.connect(master, broker_id=1)
        async with impostor.stream:
            await impostor.stream.send_all(impostor.protocol.send_handshake())
            assert await impostor.closed_by_master()

        # An ack of bytes it was never sent.
        liar = await RawSlave.connect(master, broker_id=3)
        async with liar.stream:
            await liar.handshake(0)
            with trio.fail_after(COPY_TIMEOUT):
                await liar.receive_until(end)
            await liar.ack(end + 4096)
            assert await liar.closed_by_master()

        # The master goes on: it takes puts, and a real slave copies it.
        end = await put(master, "Hostile", b"after")
        async with open_store(controller_config(tmp_path / "s")) as slave:
            await croles.change_to_slave(slave, ha_addr(master), broker_id=2)
            await copied(slave, end)
            assert log_bytes(slave, end) == log_bytes(master, end)


async def test_a_slave_with_a_torn_tail_becomes_master_and_its_queues_follow_its_puts(tmp_path):
    """The log of a slave cut mid-frame ends inside a record: becoming master cuts that half
    record and appends the epoch entry where the whole records end; the consume queues then
    take the new master's puts (the dispatcher was waiting past the old, torn end)."""
    async with open_store(controller_config(tmp_path / "m")) as old:
        await become_master(old, epoch=1, broker_id=1)
        ends = [await put(old, "Torn", body(i)) for i in range(4)]
        ends.append(await put(old, "Torn", b"a long one " * 200))  # longer than the next put
        log = log_bytes(old, ends[-1])
    whole = ends[3]
    async with open_store(controller_config(tmp_path / "s")) as store:
        await store.commitlog.append_replica(0, log[: whole + (ends[4] - whole) // 2])
        await store.wait_dispatched(whole)
        await become_master(store, epoch=2, broker_id=2)
        assert store.commitlog.max_offset == whole
        assert history(store) == (EpochEntry(2, whole),)
        await put(store, "Torn", b"first of the new master")
        with trio.fail_after(COPY_TIMEOUT):
            await store.wait_dispatched()
        got = [m.body for m in await store.get_messages("Torn", 0, 0, 100)]
        assert got == [body(i) for i in range(4)] + [b"first of the new master"]


async def test_a_slave_whose_epochs_the_master_does_not_share_keeps_its_log_and_retries(
        tmp_path, caplog):
    """No consistent point (-1): the handshake fails, the log says why, nothing is cut, and
    the client tries again (after 2 s, as RocketMQ)."""
    async with open_store(controller_config(tmp_path / "m")) as master, \
            open_store(controller_config(tmp_path / "s")) as slave:
        await become_master(master, epoch=1, broker_id=1)
        await put(master, "Alien", b"the master's")
        await become_master(slave, epoch=5, broker_id=2)
        end = await put(slave, "Alien", b"another set's")
        await croles.change_to_slave(slave, ha_addr(master), broker_id=2)
        client = slave.ha_client
        assert isinstance(client, AutoSwitchHAClient)
        await wait_until(lambda: client.last_error is not None, "the failed handshake",
                         timeout=COPY_TIMEOUT)
        assert "no consistent point" in (client.last_error or "")
        assert "shares no epoch" in caplog.text
        assert slave.commitlog.max_offset == end and client.truncated_bytes == 0
        assert history(slave) == (EpochEntry(5, 0),)


async def test_a_slave_with_ha_master_address_copies_from_it_without_the_name_server(tmp_path):
    # A configured haMasterAddress pins the slave's source (how a test puts a proxy in front
    # of the master): a change to slave that names no address copies from it.
    async with open_store(controller_config(tmp_path / "a")) as a:
        await become_master(a, epoch=1, broker_id=1)
        end = 0
        for i in range(10):
            end = await put(a, "Pinned", body(i))
        config = controller_config(tmp_path / "b", ha_master_address=ha_addr(a))
        async with open_store(config) as b:
            await croles.change_to_slave(b, None, broker_id=2)
            assert isinstance(b.ha_client, AutoSwitchHAClient)
            await copied(b, end)
            assert log_bytes(b, end) == log_bytes(a, end)
