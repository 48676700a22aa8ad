"""Queue locks for orderly consumption (LOCK_BATCH_MQ / UNLOCK_BATCH_MQ, issue 12): one client
of a group holds a queue at a time, a lock lasts 60 s past its last renewal, an expired lock is
taken over; the bodies as RocketMQ's Java client writes them; master and slave both answer."""

import json

import pytest
import trio

from trio_ha.broker.queue_locks import LOCK_LIFETIME, QueueLockManager
from trio_ha.remoting import open_remoting_client
from trio_ha.testing import ClusterConfig, serve_cluster
from trio_ha.wire.errors import RouteDecodeError
from trio_ha.wire.queue_locks import MAX_QUEUES, LockBatchRequest, LockBatchResponse, QueueId
from trio_ha.wire.remoting import RemotingCommand, RequestCode, ResponseCode

Q = [QueueId("Orders", "broker-a", i) for i in range(4)]

# As the Java client's LockBatchRequestBody.encode() writes it (fastjson, fields sorted).
JAVA_BODY = (b'{"clientId":"10.0.0.1@123","consumerGroup":"og","mqSet":[{"brokerName":"broker-a",'
             b'"queueId":0,"topic":"Orders"},{"brokerName":"broker-a","queueId":3,'
             b'"topic":"Orders"}]}')


def test_the_java_body_decodes_and_round_trips():
    body = LockBatchRequest.decode(JAVA_BODY)
    assert body == LockBatchRequest("og", "10.0.0.1@123", (Q[0], Q[3]))
    assert LockBatchRequest.decode(body.encode()) == body
    answer = LockBatchResponse((Q[3],))
    assert json.loads(answer.encode()) == {
        "lockOKMQSet": [{"brokerName": "broker-a", "queueId": 3, "topic": "Orders"}]}
    assert LockBatchResponse.decode(answer.encode()) == answer


@pytest.mark.parametrize("bad", [
    b"", b"[]", b'{"clientId":"c","mqSet":[]}', b'{"consumerGroup":"g","clientId":"c",'
    b'"mqSet":[{"topic":"T","brokerName":"b"}]}', b'{"consumerGroup":"g","clientId":"c",'
    b'"mqSet":[{"topic":"T","brokerName":"b","queueId":"x"}]}',
    json.dumps({"consumerGroup": "g", "clientId": "c", "mqSet": [
        {"topic": "T", "brokerName": "b", "queueId": i} for i in range(MAX_QUEUES + 1)]}).encode(),
])
def test_bad_bodies_are_typed_errors(bad):
    with pytest.raises(RouteDecodeError):
        LockBatchRequest.decode(bad)


async def test_one_client_of_a_group_holds_a_queue_until_its_lock_expires(autojump_clock):
    locks = QueueLockManager()
    assert locks.lock("og", "c1", Q[:2]) == {Q[0], Q[1]}
    # The other client gets only what is free; another group is another table.
    assert locks.lock("og", "c2", Q) == {Q[2], Q[3]}
    assert locks.lock("other", "c2", Q[:1]) == {Q[0]}
    assert locks.holder("og", Q[0]) == "c1"
    # Renewed within the lifetime, the lock stays c1's.
    await trio.sleep(LOCK_LIFETIME - 1)
    assert locks.lock("og", "c1", Q[:1]) == {Q[0]}
    await trio.sleep(2)
    assert locks.lock("og", "c2", Q[:2]) == {Q[1]}  # Q[1] was not renewed: expired, taken over
    assert locks.holder("og", Q[1]) == "c2"
    # Unlock frees only the caller's own locks.
    locks.unlock("og", "c2", Q[:1])
    assert locks.holder("og", Q[0]) == "c1"
    locks.unlock("og", "c1", Q[:1])
    assert locks.holder("og", Q[0]) is None
    assert locks.lock("og", "c2", Q[:1]) == {Q[0]}


async def test_the_table_is_bounded_and_expired_locks_make_room(autojump_clock):
    locks = QueueLockManager(max_locks=3)
    assert locks.lock("g1", "c", Q[:3]) == set(Q[:3])
    assert locks.lock("g2", "c", Q[:1]) == set()  # full: refused, not grown
    await trio.sleep(LOCK_LIFETIME + 1)
    assert locks.lock("g2", "c", Q[:1]) == {Q[0]}  # the expired ones were swept


def lock_request(code, group, client, queues):
    return RemotingCommand.request(code, body=LockBatchRequest(group, client, queues).encode())


async def test_master_and_slave_answer_lock_requests(nursery, tmp_path):
    addresses = await nursery.start(serve_cluster, ClusterConfig(data_dir=tmp_path / "c"))
    for broker in (addresses.master, addresses.slave):
        async with open_remoting_client(broker.broker_addr) as client:
            reply = await client.invoke(lock_request(RequestCode.LOCK_BATCH_MQ, "og", "c1", Q[:2]), 5)
            assert reply.code == ResponseCode.SUCCESS
            assert set(LockBatchResponse.decode(reply.body).lock_ok_mq_set) == set(Q[:2])
            reply = await client.invoke(lock_request(RequestCode.LOCK_BATCH_MQ, "og", "c2", Q), 5)
            assert set(LockBatchResponse.decode(reply.body).lock_ok_mq_set) == set(Q[2:])
            reply = await client.invoke(lock_request(RequestCode.UNLOCK_BATCH_MQ, "og", "c1", Q), 5)
            assert reply.code == ResponseCode.SUCCESS
            reply = await client.invoke(lock_request(RequestCode.LOCK_BATCH_MQ, "og", "c2", Q), 5)
            assert set(LockBatchResponse.decode(reply.body).lock_ok_mq_set) == set(Q)
            bad = await client.invoke(RemotingCommand.request(RequestCode.LOCK_BATCH_MQ,
                                                              body=b"{nope"), 5)
            assert bad.code == ResponseCode.SYSTEM_ERROR and "bad lock request" in (bad.remark or "")
