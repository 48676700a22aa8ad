"""The requests a client sends a broker, written by hand: valid ones, and those a broker must
refuse (``invalid_requests``).

Why by hand rather than through the client library: an attacker sends what it likes, and
the library would refuse to write a name with a slash or a negative queue. The attacks of
``broker`` and ``remoting`` send these; the broker's tests build their requests with them too.
"""

from __future__ import annotations

import json

from ...wire.permission import Permission
from ...wire.remoting import JavaValue, PullSysFlag, RemotingCommand, RequestCode, encode

__all__ = [
    "BAD_GROUP", "BAD_TOPIC", "LONG_TOPIC", "commit_request", "create_topic_request",
    "heartbeat_request", "invalid_requests", "lock_request", "pull_request", "request_frames",
    "send_request", "subscription_group_request",
]

#: a 250-character group name ending in "/"
BAD_GROUP = "g" * 249 + "/"
BAD_TOPIC = "../etc"
LONG_TOPIC = "t" * 300


def request_frames(code: int, count: int, **fields: JavaValue) -> bytes:
    """``count`` requests of ``code`` with the custom header ``fields``, as one byte string
    (pipelined: opaque 1, 2, ...)."""
    return b"".join(encode(RemotingCommand.request(code, fields, opaque=i + 1))
                    for i in range(count))


def send_request(topic: str, body: bytes = b"x", *, queue: int = 0,
                 code: int = RequestCode.SEND_MESSAGE_V2, default: str = "TBW102",
                 queue_nums: int = 4, group: str = "pg") -> RemotingCommand:
    fields = {"producerGroup": group, "topic": topic, "defaultTopic": default,
              "defaultTopicQueueNums": queue_nums, "queueId": queue, "sysFlag": 0,
              "bornTimestamp": 1, "flag": 0}
    if code != RequestCode.SEND_MESSAGE:  # V2 and batches: the same fields, one letter each
        fields = dict(zip("abcdefgh", fields.values(), strict=True))
    return RemotingCommand.request(code, fields, body=body)


def pull_request(topic: str = "T", *, group: str = "cg", queue: int = 0, offset: int = 0,
                 commit: int | None = None, suspend_millis: int = 0) -> RemotingCommand:
    flags = PullSysFlag.COMMIT_OFFSET if commit is not None else PullSysFlag(0)
    if suspend_millis:
        flags |= PullSysFlag.SUSPEND
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, {
        "consumerGroup": group, "topic": topic, "queueId": queue, "queueOffset": offset,
        "maxMsgNums": 32, "sysFlag": int(flags), "commitOffset": commit or 0,
        "suspendTimeoutMillis": suspend_millis, "subVersion": 0,
    })


def commit_request(group: str, topic: str, queue: int = 0, offset: int = 1) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, {
        "consumerGroup": group, "topic": topic, "queueId": queue, "commitOffset": offset,
    })


def heartbeat_request(client_id: str, *, consumers: tuple[str, ...] | list[str] = (),
                      producers: tuple[str, ...] | list[str] = (),
                      topic: str = "T") -> RemotingCommand:
    return RemotingCommand.request(RequestCode.HEART_BEAT, body=json.dumps({
        "clientID": client_id,
        "consumerDataSet": [{
            "groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
            "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "unitMode": False,
            "subscriptionDataSet": [{"topic": topic, "subString": "*", "tagsSet": [],
                                     "codeSet": [], "subVersion": 0, "classFilterMode": False}],
        } for group in consumers],
        "producerDataSet": [{"groupName": group} for group in producers],
    }).encode())


def create_topic_request(topic: str, queues: int = 4,
                         perm: int = Permission.READ | Permission.WRITE) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
        "topic": topic, "readQueueNums": queues, "writeQueueNums": queues, "perm": int(perm),
    })


def subscription_group_request(group: str) -> RemotingCommand:
    """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP of ``group`` with RocketMQ's defaults."""
    return RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                                   body=json.dumps({"groupName": group}).encode())


def lock_request(group: str, client_id: str, queues: list[tuple[str, str, int]],
                 *, code: int = RequestCode.LOCK_BATCH_MQ) -> RemotingCommand:
    """LOCK_BATCH_MQ (or UNLOCK_BATCH_MQ) for ``queues`` as (topic, brokerName, queueId)."""
    return RemotingCommand.request(code, body=json.dumps({
        "consumerGroup": group, "clientId": client_id,
        "mqSet": [{"topic": t, "brokerName": b, "queueId": q} for t, b, q in queues],
    }).encode())


def invalid_requests() -> dict[str, RemotingCommand]:
    """One request per broker handler path that takes a name or a number from the client,
    each with a value the broker must refuse."""
    consumer = {"groupName": BAD_GROUP, "consumeType": "CONSUME_PASSIVELY",
                "messageModel": "CLUSTERING", "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
                "subscriptionDataSet": [], "unitMode": False}
    return {
        "pull with a bad group": pull_request(group=BAD_GROUP),
        "pull committing for a bad group": pull_request(group=BAD_GROUP, commit=5),
        "heartbeat with a bad consumer group": RemotingCommand.request(
            RequestCode.HEART_BEAT, body=json.dumps(
                {"clientID": "c", "consumerDataSet": [consumer], "producerDataSet": []}
            ).encode()),
        "heartbeat with a bad producer group": heartbeat_request("c", producers=[BAD_GROUP]),
        "commit for a bad group": commit_request(BAD_GROUP, "T"),
        "commit for a bad topic": commit_request("cg", BAD_TOPIC),
        "commit to a negative queue": commit_request("cg", "T", queue=-1),
        "commit of a negative offset": commit_request("cg", "T", offset=-1),
        "commit to a queue the topic does not have": commit_request("cg", "T", queue=2**31 - 1),
        "send to a bad topic": send_request(BAD_TOPIC),
        "send to a too long topic": send_request(LONG_TOPIC),
        "send to a blank topic": send_request(""),
        "subscription group with a bad name": RemotingCommand.request(
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
            body=json.dumps({"groupName": BAD_GROUP}).encode()),
        "subscription group body that is not an object": RemotingCommand.request(
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=b"[]"),
        "topic with a bad name": create_topic_request(BAD_GROUP),
        "topic with too many queues": create_topic_request("Ok", 2**31 - 1),
        "topic with a bad filter type": RemotingCommand.request(
            RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "Ok", "readQueueNums": 4,
                                                  "writeQueueNums": 4,
                                                  "topicFilterType": "x\n" * 200}),
        "consumer list of a bad group": RemotingCommand.request(
            RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": BAD_GROUP}),
    }
