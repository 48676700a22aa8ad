"""Transactional messages (issue 12): half messages, END_TRANSACTION, the check-back and the
give-up after transactionCheckMax, over the wire against a real broker, and a SIGKILL of the
master between prepare and commit resolved through the check-back."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from conftest import pulled, wait_until
from trio_ha import open_store
from trio_ha.broker import transactions
from trio_ha.broker.clients import ClientManager
from trio_ha.broker.metadata import BrokerMetadata
from trio_ha.client import (
    Message,
    TransactionState,
    open_client_instance,
    open_producer,
    open_pull_consumer,
)
from trio_ha.remoting import open_remoting_client
from trio_ha.store import PutRequest
from trio_ha.testing import ClusterConfig, ProcessCluster, free_broker_port, serve_cluster
from trio_ha.wire import record as rec
from trio_ha.wire.heartbeat import HeartbeatData, ProducerData
from trio_ha.wire.metadata import TRANS_CHECK_MAX_TIME_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from trio_ha.wire.remoting import RemotingCommand, RequestCode, ResponseCode

GROUP = "txp"
FAST_CHECKS = {"transactionCheckInterval": 200, "transactionTimeOut": 0,
               "transactionCheckMax": 3}


def prepare(topic: str, body: bytes, uniq: str, group: str = GROUP) -> RemotingCommand:
    props = rec.encode_properties({"TRAN_MSG": "true", "PGROUP": group, "UNIQ_KEY": uniq,
                                   "KEYS": uniq})
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {
        "a": group, "b": topic, "c": "TBW102", "d": 4, "e": 1, "f": rec.TRANSACTION_PREPARED,
        "g": 1, "h": 0, "i": props}, body=body)


def end(decision: int, commitlog_offset: int, table_offset: int, *, group: str = GROUP,
        from_check: bool = False) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.END_TRANSACTION, {
        "producerGroup": group, "tranStateTableOffset": table_offset,
        "commitLogOffset": commitlog_offset, "commitOrRollback": decision,
        "fromTransactionCheck": "true" if from_check else "false", "msgId": "", "transactionId": ""})


def offsets_of(reply: RemotingCommand) -> tuple[int, int]:
    """(commitlog offset, queue offset) of a half message from its send's answer."""
    _, commitlog_offset = rec.decode_message_id(reply.ext_fields["msgId"])
    return commitlog_offset, int(reply.ext_fields["queueOffset"])


async def start_broker(nursery, tmp_path, properties: dict) -> str:
    addresses = await nursery.start(serve_cluster, ClusterConfig(
        data_dir=tmp_path / "c", slaves=0, master_role="ASYNC_MASTER", properties=properties))
    return addresses.master.broker_addr


@pytest.fixture
async def broker(nursery, tmp_path):
    """No check-back during the test (RocketMQ's 60 s interval)."""
    return await start_broker(nursery, tmp_path, {})


@pytest.fixture
async def checking_broker(nursery, tmp_path):
    """Checks every 200 ms, of half messages of any age, at most 3 times."""
    return await start_broker(nursery, tmp_path, FAST_CHECKS)


async def test_commit_delivers_and_rollback_does_not(broker):
    async with open_remoting_client(broker) as client:
        committed = await client.invoke(prepare("Orders", b"yes", "U1"), 5)
        rolled = await client.invoke(prepare("Orders", b"no", "U2"), 5)
        assert committed.code == rolled.code == ResponseCode.SUCCESS
        assert committed.ext_fields["queueId"] == "1"  # the queue the producer chose
        # Half messages: in the half topic, invisible in their own.
        async def both_halves():
            found = await pulled(client, TRANS_HALF_TOPIC, 0)
            return found if len(found) == 2 else None

        halves = await wait_until(both_halves, "the two half messages to be dispatched")
        assert [m.body for m in halves] == [b"yes", b"no"]
        assert halves[0].properties[rec.PROPERTY_REAL_TOPIC] == "Orders"
        assert halves[0].properties[rec.PROPERTY_REAL_QUEUE_ID] == "1"
        assert halves[0].sys_flag & rec.TRANSACTION_TYPE_MASK == rec.TRANSACTION_NOT_TYPE
        assert await pulled(client, "Orders", 1) == []

        reply = await client.invoke(end(rec.TRANSACTION_COMMIT, *offsets_of(committed)), 5)
        assert reply.code == ResponseCode.SUCCESS, reply.remark
        reply = await client.invoke(end(rec.TRANSACTION_ROLLBACK, *offsets_of(rolled)), 5)
        assert reply.code == ResponseCode.SUCCESS, reply.remark
        [message] = await wait_until(lambda: pulled(client, "Orders", 1), "the commit")
        assert message.body == b"yes" and message.properties["UNIQ_KEY"] == "U1"
        assert message.sys_flag & rec.TRANSACTION_TYPE_MASK == rec.TRANSACTION_COMMIT
        assert message.prepared_transaction_offset == offsets_of(committed)[0]
        for name in ("TRAN_MSG", rec.PROPERTY_REAL_TOPIC, rec.PROPERTY_REAL_QUEUE_ID):
            assert name not in message.properties
        # Both are marked done: op messages naming their half queue offsets.
        async def both_ops():
            found = await pulled(client, TRANS_OP_HALF_TOPIC, 0)
            return found if len(found) == 2 else None

        ops = await wait_until(both_ops, "the two op messages")
        assert sorted(m.body for m in ops) == [b"0", b"1"]
        assert {m.properties["TAGS"] for m in ops} == {"d"}


@pytest.mark.parametrize(("change", "remark"), [
    ({"group": "other"}, "The producer group wrong"),
    ({"table_offset": 7}, "The transaction state table offset wrong"),
    ({"offset": 1}, "Find prepared transaction message failed"),
])
async def test_an_end_that_names_the_wrong_half_message_is_refused(broker, change, remark):
    async with open_remoting_client(broker) as client:
        half = await client.invoke(prepare("Orders", b"x", "U1"), 5)
        offset, table_offset = offsets_of(half)
        offset = change.get("offset", offset)
        table_offset = change.get("table_offset", table_offset)
        reply = await client.invoke(end(rec.TRANSACTION_COMMIT, offset, table_offset,
                                        group=change.get("group", GROUP)), 5)
        assert (reply.code, reply.remark) == (ResponseCode.SYSTEM_ERROR, remark)
        assert await pulled(client, "Orders", 1) == []


async def register_producer(client, group: str = GROUP) -> list[RemotingCommand]:
    """Heartbeat as a producer of ``group``; the broker's requests land in the list."""
    checks: list[RemotingCommand] = []
    client.on_request = lambda address, request: checks.append(request)
    body = HeartbeatData(f"test@{group}", (ProducerData(group),)).encode()
    reply = await client.invoke(RemotingCommand.request(RequestCode.HEART_BEAT, body=body), 5)
    assert reply.code == ResponseCode.SUCCESS
    return checks


async def test_an_undecided_transaction_is_checked_back_then_given_up(checking_broker):
    async with open_remoting_client(checking_broker) as client:
        checks = await register_producer(client)
        await client.invoke(prepare("Orders", b"ask me", "U9"), 5)

        # A check arrives: for the message as sent, with the offsets of its re-stored copy.
        await wait_until(lambda: len(checks) >= 1, "a check", timeout=10, interval=0.05)
        check = checks[0]
        assert check.code == RequestCode.CHECK_TRANSACTION_STATE and check.is_oneway
        [message] = [rec.decode_record(check.body)]
        assert (message.topic, message.queue_id, message.body) == ("Orders", 1, b"ask me")
        assert message.properties["TRANSACTION_CHECK_TIMES"] == "1"
        assert check.ext_fields["msgId"] == check.ext_fields["transactionId"] == "U9"
        # Unanswered, it is asked about again, transactionCheckMax (3) times, then given up.
        dead = await wait_until(lambda: pulled(client, TRANS_CHECK_MAX_TIME_TOPIC, 0),
                                "the give-up", timeout=15, interval=0.1)
        assert [m.body for m in dead] == [b"ask me"]
        assert [c.ext_fields["tranStateTableOffset"] for c in checks[:3]] == ["1", "2", "3"]
        count = len(checks)
        await trio.sleep(1)
        await trio.testing.wait_all_tasks_blocked()  # and what was due in it has run
        assert len(checks) == count == 3  # no more checks once given up
        assert await pulled(client, "Orders", 1) == []


async def test_a_check_answered_commit_delivers(checking_broker):
    async with open_remoting_client(checking_broker) as client:
        checks = await register_producer(client)
        await client.invoke(prepare("Orders", b"late yes", "U5"), 5)
        await wait_until(lambda: checks, "a check", timeout=10, interval=0.05)
        fields = checks[0].ext_fields
        reply = await client.invoke(end(rec.TRANSACTION_COMMIT, int(fields["commitLogOffset"]),
                                        int(fields["tranStateTableOffset"]), from_check=True), 5)
        assert reply.code == ResponseCode.SUCCESS, reply.remark
        [message] = await wait_until(lambda: pulled(client, "Orders", 1), "the commit")
        assert message.body == b"late yes"
        await trio.sleep(1)
        await trio.testing.wait_all_tasks_blocked()  # and what was due in it has run
        assert len(checks) == 1  # decided: never asked again


async def test_a_sigkill_between_prepare_and_commit_resolves_through_the_check(tmp_path):
    config = ClusterConfig(data_dir=tmp_path, slaves=0, master_role="ASYNC_MASTER",
                           master_port=free_broker_port(),
                           properties={**FAST_CHECKS, "transactionCheckMax": 15})
    with ProcessCluster.start(config) as cluster:
        async with open_remoting_client(cluster.master.addr) as client:
            half = await client.invoke(prepare("Orders", b"survives", "U7"), 5)
            assert half.code == ResponseCode.SUCCESS
        cluster.master.kill()  # before any END_TRANSACTION
        cluster.restart(cluster.master)
        async with open_remoting_client(cluster.master.addr) as client:
            checks = await register_producer(client)
            await wait_until(lambda: checks, "a check after the restart", timeout=20,
                             interval=0.1)
            fields = checks[0].ext_fields
            reply = await client.invoke(end(
                rec.TRANSACTION_COMMIT, int(fields["commitLogOffset"]),
                int(fields["tranStateTableOffset"]), from_check=True), 5)
            assert reply.code == ResponseCode.SUCCESS, reply.remark
            [message] = await wait_until(lambda: pulled(client, "Orders", 1), "the commit")
            assert message.body == b"survives" and message.properties["UNIQ_KEY"] == "U7"


async def test_a_slave_ends_no_transaction(nursery, tmp_path):
    addresses = await nursery.start(serve_cluster, ClusterConfig(data_dir=tmp_path / "c"))
    async with open_remoting_client(addresses.slave.broker_addr) as client:
        reply = await client.invoke(end(rec.TRANSACTION_COMMIT, 0, 0), 5)
        assert reply.code == ResponseCode.SLAVE_NOT_AVAILABLE


async def test_a_round_asks_nobody_until_it_has_read_every_op(make_config, tmp_path,
                                                             monkeypatch):
    """With the op messages read a few per round, a round that has not read them all checks
    nothing (an unread op could mark its half message done: a needless check could commit it
    twice); the next rounds go on from there and check only the undecided one."""
    monkeypatch.setattr(transactions, "MAX_OPS_PER_ROUND", 2)
    async with open_store(make_config()) as store:
        for i in range(5):
            props = transactions.half_message("Orders", 0, {"PGROUP": GROUP, "UNIQ_KEY": f"U{i}"})
            await store.put(PutRequest(TRANS_HALF_TOPIC, 0, b"x",
                                       rec.encode_properties(props).encode()))
        for i in range(4):  # the first four are decided
            await store.put(PutRequest(TRANS_OP_HALF_TOPIC, 0, str(i).encode(), b"TAGS\x01d"))
        await store.wait_dispatched()
        metadata = BrokerMetadata.load(tmp_path / "config")
        check = transactions.TransactionCheck(store, metadata, ClientManager(), interval=1000,
                                              timeout=0, check_max=15)
        await check.check_once()
        assert check.statistics().no_producer == 0  # read ops 0-1 only: asked nobody
        assert metadata.offsets.query("CID_RMQ_SYS_TRANS", TRANS_HALF_TOPIC, 0) == 2
        await check.check_once()
        assert check.statistics().no_producer == 1  # all ops read: only U4 was asked about
        assert metadata.offsets.query("CID_RMQ_SYS_TRANS", TRANS_HALF_TOPIC, 0) == 5
        assert metadata.offsets.query("CID_RMQ_SYS_TRANS", TRANS_OP_HALF_TOPIC, 0) == 4


async def test_our_producer_commits_rolls_back_and_answers_the_check(nursery, tmp_path):
    """``Producer.send_in_transaction`` with a local transaction per message; the UNKNOWN one
    is decided by the producer's ``check`` when the broker asks."""
    addresses = await nursery.start(serve_cluster, ClusterConfig(
        data_dir=tmp_path / "c", slaves=0, master_role="ASYNC_MASTER", properties=FAST_CHECKS))
    namesrv = addresses.namesrv_addr
    asked: list[str] = []

    async def check(message):
        asked.append(message.properties["UNIQ_KEY"])
        assert message.topic == "Orders"  # the message as sent, not the half topic
        return TransactionState.COMMIT

    plan = [TransactionState.COMMIT, TransactionState.ROLLBACK, TransactionState.UNKNOWN]
    with trio.fail_after(30):
        async with open_client_instance(namesrv) as instance, \
                open_producer(instance, "ourtx", check=check) as producer:
            results = []
            for i, state in enumerate(plan):

                async def local(message, state=state):
                    return state

                results.append(await producer.send_in_transaction(
                    Message("Orders", f"t{i}".encode()), local))
            assert [r.state for r in results] == plan
            ids = [r.send_result.msg_id for r in results]
            # (A round may also ask about one whose END is on its way: transactionTimeOut=0.)
            await wait_until(lambda: ids[2] in asked, "the check of the undecided one",
                             timeout=15, interval=0.05)
            async with open_pull_consumer(instance, "txreader") as reader:
                seen: set[str] = set()

                async def delivered():
                    for queue in await reader.queues("Orders", refresh=True):
                        result = await reader.pull(queue, 0, suspend_timeout=0)
                        seen.update(m.properties["UNIQ_KEY"] for m in result.messages)
                    return {ids[0], ids[2]} <= seen

                await wait_until(delivered, "the committed messages", timeout=15)
                assert ids[1] not in seen


# ---- a transaction is decided once (issue 35, defect 4) ----------------------------------------


async def ops_marking(client, count: int) -> list:
    """The op messages once there are ``count`` of them (each END that changed something
    stores one, after its commit's copy)."""
    async def enough():
        found = await pulled(client, TRANS_OP_HALF_TOPIC, 0)
        return found if len(found) >= count else None

    return await wait_until(enough, f"{count} op messages")


async def test_end_transaction_twice_delivers_once_and_the_other_decision_is_refused_as_rocketmq_does_not(
        broker):
    async with open_remoting_client(broker) as client:
        committed = offsets_of(await client.invoke(prepare("Orders", b"once", "U1"), 5))
        rolled = offsets_of(await client.invoke(prepare("Orders", b"never", "U2"), 5))
        answers = []

        async def end_it(decision, offsets):
            answers.append(await client.invoke(end(decision, *offsets), 5))

        async with trio.open_nursery() as ends:  # two at once, then one more
            ends.start_soon(end_it, rec.TRANSACTION_COMMIT, committed)
            ends.start_soon(end_it, rec.TRANSACTION_COMMIT, committed)
        await end_it(rec.TRANSACTION_COMMIT, committed)
        assert [a.code for a in answers] == [ResponseCode.SUCCESS] * 3, answers
        late = await client.invoke(end(rec.TRANSACTION_ROLLBACK, *committed), 5)
        assert late.code == ResponseCode.ILLEGAL_OPERATION
        assert late.remark == "the transaction was already decided: COMMIT"

        first = await client.invoke(end(rec.TRANSACTION_ROLLBACK, *rolled), 5)
        assert first.code == ResponseCode.SUCCESS
        again = await client.invoke(end(rec.TRANSACTION_ROLLBACK, *rolled), 5)
        assert again.code == ResponseCode.SUCCESS
        late = await client.invoke(end(rec.TRANSACTION_COMMIT, *rolled), 5)
        assert (late.code, late.remark) == (ResponseCode.ILLEGAL_OPERATION,
                                            "the transaction was already decided: ROLLBACK")
        ops = await ops_marking(client, 2)
        assert sorted(m.body for m in ops) == [b"0", b"1"]  # one per half message
        assert {m.properties["TRAN_DECISION"] for m in ops} == {"COMMIT", "ROLLBACK"}
        # Every copy is stored before its op message, so all would be here now.
        delivered = await pulled(client, "Orders", 1)
        assert [m.body for m in delivered] == [b"once"]


async def test_a_check_racing_the_producers_own_end_delivers_once_as_rocketmq_does_not(
        checking_broker):
    """The check stores a copy of the half message and asks; the producer's own COMMIT of
    the original and its answer about the copy arrive together: one delivery, both answered
    SUCCESS, both half messages marked done, no check after."""
    async with open_remoting_client(checking_broker) as client:
        checks = await register_producer(client)
        original = offsets_of(await client.invoke(prepare("Orders", b"raced", "U3"), 5))
        await wait_until(lambda: checks, "a check", timeout=10, interval=0.05)
        fields = checks[0].ext_fields
        copy = int(fields["commitLogOffset"]), int(fields["tranStateTableOffset"])
        assert copy != original
        answers = []

        async def end_it(offsets, from_check):
            answers.append(await client.invoke(
                end(rec.TRANSACTION_COMMIT, *offsets, from_check=from_check), 5))

        async with trio.open_nursery() as ends:
            ends.start_soon(end_it, copy, True)
            ends.start_soon(end_it, original, False)
        assert [a.code for a in answers] == [ResponseCode.SUCCESS] * 2, answers
        ops = await ops_marking(client, 2)
        assert sorted(int(m.body) for m in ops) == sorted([original[1], copy[1]])
        assert [m.body for m in await pulled(client, "Orders", 1)] == [b"raced"]
        asked = len(checks)
        await trio.sleep(1)  # five check rounds
        await trio.testing.wait_all_tasks_blocked()  # and what was due in it has run
        assert len(checks) == asked  # decided: never asked again
        assert [m.body for m in await pulled(client, "Orders", 1)] == [b"raced"]


async def test_a_transactions_decision_survives_a_restart_as_rocketmq_does_not(make_config):
    """The decision is read back from the op messages (through the index) after a restart:
    a repeated COMMIT delivers nothing more and a ROLLBACK is refused."""
    props = transactions.half_message("Orders", 0, {"PGROUP": GROUP, "UNIQ_KEY": "U4",
                                                    "TRAN_MSG": "true"})

    async def end_with(store, decision, half):
        decisions = transactions.TransactionDecisions(store)
        return await transactions.end_transaction(
            store, end(decision, half.commitlog_offset, half.queue_offset), decisions)

    async with open_store(make_config()) as store:
        put = await store.put(PutRequest(TRANS_HALF_TOPIC, 0, b"kept",
                                         rec.encode_properties(props).encode()))
        half = await store.look_message_by_offset(put.commitlog_offset)
        assert half is not None
        assert (await end_with(store, rec.TRANSACTION_COMMIT, half)).code == ResponseCode.SUCCESS
        await store.wait_dispatched()
    async with open_store(make_config()) as store:
        again = await end_with(store, rec.TRANSACTION_COMMIT, half)
        assert again.code == ResponseCode.SUCCESS
        other = await end_with(store, rec.TRANSACTION_ROLLBACK, half)
        assert other.code == ResponseCode.ILLEGAL_OPERATION
        await store.wait_dispatched()
        assert [m.body for m in await store.get_messages("Orders", 0, 0, 10)] == [b"kept"]
        assert store.max_queue_offset(TRANS_OP_HALF_TOPIC, 0) == 1  # no op for the repeats
