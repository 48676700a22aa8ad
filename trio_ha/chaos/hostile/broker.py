"""The attacker that speaks the remoting protocol well, through an ordinary remoting client,
and asks a broker what it must refuse or bound: names and numbers a handler must reject
(``invalid_input``), groups and topics that do not exist by the thousand
(``metadata_flood``), every queue lock (``lock_hoarding``), the group table filled by
heartbeats (``group_flood``), and an offset past a queue's end committed to a slave for it to
hand to its master (``offset_past_the_end_through_the_slave``).

Why together: each is a client the broker serves, whose requests are valid frames; what is
attacked is the broker's tables and handlers, and the verdict is in its answers (a refusal
in one short line, a table that stays within its cap, an honest client that still gets its
lock, its group, its offset). Attacks on the connections themselves are in ``remoting``.
"""

from __future__ import annotations

import json
import random

import trio

from ...remoting import RemotingError, open_remoting_client
from ...wire.metadata import decode_consumer_offsets, offset_key
from ...wire.remoting import RemotingCommand, RequestCode, ResponseCode
from ._common import AttackOutcome, Tally, code_name
from .requests import (
    commit_request,
    heartbeat_request,
    invalid_requests,
    lock_request,
    pull_request,
    subscription_group_request,
)

__all__ = [
    "group_flood", "invalid_input", "is_one_short_line", "lock_hoarding", "metadata_flood",
    "offset_past_the_end_through_the_slave",
]


def is_one_short_line(remark: str | None, limit: int = 300) -> bool:
    """A refusal's remark as the broker must write it: one line, not a traceback."""
    return remark is not None and "\n" not in remark and len(remark) <= limit


async def invalid_input(address: str, *, rounds: int = 1, seconds: float = 30.0) -> AttackOutcome:
    """Every request of ``invalid_requests`` ``rounds`` times, over one connection: each must
    be refused with a one-line answer. ``answers`` counts them by response code;
    ``note`` names any that were not refused, or refused with more than one short line."""
    tally = Tally("invalid input", address)
    odd: set[str] = set()
    with trio.move_on_after(seconds):
        async with open_remoting_client(address) as client:
            tally.connections += 1
            for _ in range(rounds):
                for name, request in invalid_requests().items():
                    try:
                        reply = await client.invoke(request, 5)
                    except RemotingError:
                        tally.answers["no answer"] += 1
                        continue
                    tally.frames_sent += 1
                    tally.answers[code_name(reply.code)] += 1
                    if reply.code == ResponseCode.SUCCESS or not is_one_short_line(reply.remark):
                        odd.add(name)
    tally.note = "; ".join(sorted(odd))
    return tally.outcome()


async def metadata_flood(address: str, *, heartbeats: int = 200, pulls: int = 300,
                         seconds: float = 60.0, prefix: str = "flood") -> AttackOutcome:
    """Heartbeats naming new consumer and producer groups (three of each per heartbeat),
    pulls for new groups, and commits for new groups on topics that do not exist: the
    broker's tables must stay within their caps. ``answers`` counts replies as
    ``<request>:<response code>``; ``note`` counts remarks that were not one short line."""
    tally = Tally("metadata flood", address)
    long_remarks = 0

    def count(kind: str, reply: RemotingCommand) -> None:
        nonlocal long_remarks
        tally.frames_sent += 1
        tally.answers[f"{kind}:{code_name(reply.code)}"] += 1
        if reply.code != ResponseCode.SUCCESS and not is_one_short_line(reply.remark):
            long_remarks += 1

    with trio.move_on_after(seconds):
        async with open_remoting_client(address) as client:
            tally.connections += 1
            for i in range(heartbeats):
                names = [f"{prefix}{i}_{j}" for j in range(3)]
                count("HEART_BEAT", await client.invoke(
                    heartbeat_request(f"{prefix}-client{i}", consumers=names, producers=names),
                    5))
            for i in range(pulls):
                count("PULL_MESSAGE", await client.invoke(
                    pull_request(group=f"{prefix}puller{i}"), 5))
                count("UPDATE_CONSUMER_OFFSET", await client.invoke(
                    commit_request(f"{prefix}{i}_0", f"{prefix}NoSuchTopic{i}"), 5))
    tally.note = f"{long_remarks} refusals not one short line" if long_remarks else ""
    return tally.outcome()


def _locked(reply: RemotingCommand) -> int:
    if reply.code != ResponseCode.SUCCESS or not reply.body:
        return 0
    return len(json.loads(reply.body).get("lockOKMQSet") or [])


async def lock_hoarding(address: str, *, requests: int = 70, queues: int = 4096,
                        broker_name: str = "broker-a", seconds: float = 60.0,
                        prefix: str = "hoard") -> AttackOutcome:
    """``requests`` LOCK_BATCH_MQ over one connection, each for ``queues`` made-up queues
    under a new group and client id (a hoarder that would hold every lock the broker has);
    then an orderly consumer on another connection locks four queues of its own group.
    ``answers``: the replies by code, ``hoarded`` the locks the hoarder got, ``honest
    locked`` those the consumer got (4 when the broker bounds the hoarder). The consumer
    asks after the hoarding, which ``seconds`` bounds, even when that was cut short."""
    tally = Tally("lock hoarding", address)
    with trio.move_on_after(seconds):
        async with open_remoting_client(address) as hoarder:
            tally.connections += 1
            for i in range(requests):
                mq = [(f"{prefix}T{i}", broker_name, q) for q in range(queues)]
                reply = await hoarder.invoke(lock_request(f"{prefix}g{i}", f"{prefix}c{i}", mq),
                                             10)
                tally.frames_sent += 1
                tally.answers[f"LOCK_BATCH_MQ:{code_name(reply.code)}"] += 1
                tally.answers["hoarded"] += _locked(reply)
    async with open_remoting_client(address) as honest:
        tally.connections += 1
        reply = await honest.invoke(lock_request(
            f"{prefix}_orderly", f"{prefix}_orderly@1",
            [(f"{prefix}Orders", broker_name, q) for q in range(4)]), 10)
        tally.frames_sent += 1
        tally.answers["honest locked"] += _locked(reply)
    return tally.outcome()


async def group_flood(address: str, *, heartbeats: int = 10, groups: int = 10_000,
                      seconds: float = 60.0, prefix: str = "gflood") -> AttackOutcome:
    """``heartbeats`` HEART_BEATs over one connection, each declaring ``groups`` new consumer
    groups (a flood that would fill maxSubscriptionGroupNums); then an operator creates a
    group (UPDATE_AND_CREATE_SUBSCRIPTIONGROUP) and a consumer on another connection
    heartbeats and pulls as a member of it. ``answers``: the replies as
    ``<request>:<code>``; the pull's SUCCESS (or PULL_NOT_FOUND, on a topic without
    messages) means the group works. The operator's turn comes after the flood, which
    ``seconds`` bounds, even when that was cut short."""
    tally = Tally("group flood", address)
    with trio.move_on_after(seconds):
        async with open_remoting_client(address) as flooder:
            tally.connections += 1
            for i in range(heartbeats):
                names = [f"{prefix}{i}_{j}" for j in range(groups)]
                reply = await flooder.invoke(heartbeat_request(f"{prefix}-c{i}", consumers=names),
                                             30)
                tally.frames_sent += 1
                tally.answers[f"HEART_BEAT:{code_name(reply.code)}"] += 1
    async with open_remoting_client(address) as operator:
        tally.connections += 1
        group = f"{prefix}_admin"
        for kind, request in (
            ("UPDATE_AND_CREATE_SUBSCRIPTIONGROUP", subscription_group_request(group)),
            ("HEART_BEAT", heartbeat_request(f"{prefix}-member", consumers=[group])),
            ("PULL_MESSAGE", pull_request(group=group)),
        ):
            reply = await operator.invoke(request, 10)
            tally.frames_sent += 1
            tally.answers[f"admin {kind}:{code_name(reply.code)}"] += 1
    return tally.outcome()


#: an offset no queue reaches
_FAR_PAST_THE_END = 1 << 62


async def offset_past_the_end_through_the_slave(
        slave: str, master: str, topic: str, *, queue: int = 0, group: str | None = None,
        seconds: float = 15.0) -> AttackOutcome:
    """A consumer commits an offset far past the queue's end to a slave (UPDATE_CONSUMER_OFFSET);
    the slave hands offsets committed to it to its master at its next sync, and the master must
    end up holding at most the queue's end. ``group`` (default: a new one each time, made on
    the master first) must have no offset of ``topic`` on the master. ``answers``: the
    group's creation and the commit as ``<request>:<code>``, then ``master:capped`` (the
    master's offset is at most its max offset), ``master:past the end``, or ``master:not yet``
    when ``seconds`` passed first (the slave syncs every slaveSyncInterval)."""
    tally = Tally("offset past the end through the slave", slave)
    group = group or f"chaos_past_end_{random.randrange(1 << 30)}"
    key = offset_key(topic, group)
    everything = RemotingCommand.request(RequestCode.GET_ALL_CONSUMER_OFFSET)
    end = RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": queue})
    verdict = "master:not yet"
    with trio.move_on_after(seconds):
        async with open_remoting_client(master) as operator, \
                open_remoting_client(slave) as consumer:
            tally.connections += 2
            reply = await operator.invoke(subscription_group_request(group), 10)
            tally.answers[f"UPDATE_AND_CREATE_SUBSCRIPTIONGROUP:{code_name(reply.code)}"] += 1
            reply = await consumer.invoke(commit_request(group, topic, queue, _FAR_PAST_THE_END),
                                          10)
            tally.frames_sent += 2
            tally.answers[f"UPDATE_CONSUMER_OFFSET:{code_name(reply.code)}"] += 1
            for _ in range(100_000):  # bounded: the deadline ends it first
                table, top = await operator.invoke(everything, 10), await operator.invoke(end, 10)
                tally.frames_sent += 2
                if table.code == ResponseCode.SUCCESS and top.code == ResponseCode.SUCCESS:
                    offset = decode_consumer_offsets(table.body).offset_table.get(
                        key, {}).get(queue)
                    if offset is not None:
                        capped = offset <= int(top.ext_fields["offset"])
                        verdict = "master:capped" if capped else "master:past the end"
                        break
                await trio.sleep(0.2)
    tally.answers[verdict] += 1
    return tally.outcome()
