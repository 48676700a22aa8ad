"""Sharing a topic's queues among the live consumers of one group (clustering).

Every consumer of a group computes the same split on its own, from the same two lists: the
topic's readable queues (from the route) and the group's live client ids (GET_CONSUMER_LIST_BY_
GROUP, which the broker answers from the consumers' heartbeats). Both lists are sorted, and
each client takes the slice ``allocate_averagely`` gives its own id — RocketMQ's
AllocateMessageQueueAveragely, so a group may mix our consumers and Java ones and still
split its queues without overlap.

When the group changes (a member joins, leaves or its connection drops) the broker sends each
member NOTIFY_CONSUMER_IDS_CHANGED, and each computes its split again; it also does so every
``REBALANCE_INTERVAL`` (RocketMQ's 20 s), which mends a missed notification. While two members
disagree for a moment (one has seen the change, the other not yet), a queue may be read by
both: consumption is at-least-once, never with a gap, because a member that gives a queue up
commits what it consumed first and drops what it had buffered but not handed out, and the
member that takes it starts from the committed offset.
"""

from __future__ import annotations

from collections.abc import Sequence

from .instance import MessageQueue

__all__ = ["REBALANCE_INTERVAL", "allocate_averagely"]

#: seconds between rebalances when nothing notifies (RocketMQ's rebalance service waits 20 s)
REBALANCE_INTERVAL = 20.0


def allocate_averagely(
    queues: Sequence[MessageQueue], consumer_ids: Sequence[str], me: str
) -> list[MessageQueue]:
    """The queues ``me`` reads: after sorting both lists, consecutive slices of the queues in
    client-id order, the first ``len(queues) % len(ids)`` clients taking one more. A client
    not in ``consumer_ids`` (its heartbeat not seen yet) reads nothing."""
    ordered = sorted(queues)
    ids = sorted(consumer_ids)
    if me not in ids or not ordered:
        return []
    index, clients, count = ids.index(me), len(ids), len(ordered)
    rest = count % clients
    if count <= clients:
        size = 1
    elif rest and index < rest:
        size = count // clients + 1
    else:
        size = count // clients
    start = index * size if rest and index < rest else index * size + rest
    return [ordered[(start + i) % count] for i in range(min(size, count - start))]
