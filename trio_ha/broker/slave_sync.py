"""A slave copies its master's metadata (RocketMQ's SlaveSynchronize).

Every ``slaveSyncInterval`` (first after a few seconds) a slave that knows its master — learned
through registration — fetches the master's topics, consumer offsets, delay offsets and
subscription groups (GET_ALL_*) and takes them: topics and groups wholesale when the master's
DataVersion differs, delay offsets as they are, consumer offsets merged so that none moves
back (RocketMQ issue #1094; see ``metadata.consumer_offsets``). The store's replication copies
the messages themselves; this copies what a consumer needs to carry on at the slave when the
master is gone.

The other way, one thing goes back: offsets consumers committed to this slave while the master
was away. Each round, once the master's offsets are fetched, every such offset still ahead of
the master's is sent to it with UPDATE_CONSUMER_OFFSET, as a consumer would have sent it (RocketMQ
4.9 has no way back, so a returning master hands the group those messages again; 5.x's master
pulls its slaves' whole table when it comes online, with ``enableSlaveActingMaster``). So the
master learns them at the first round after it returns, and no consumer of the group reads them
twice from it. A table whose sync fails is logged and tried again at the next interval; the
others are not held up by it. ``SlaveSync.statistics()`` tells, per table, when it was last
synced and how that went.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import attrs
import trio

from ..remoting import RemotingClientPool, RemotingError
from ..wire.errors import MetadataDecodeError, RouteDecodeError
from ..wire.metadata import (
    ConsumerOffsetTable,
    decode_consumer_offsets,
    decode_delay_offsets,
    decode_subscription_groups,
    decode_topics_json,
    split_offset_key,
)
from ..wire.remoting import RemotingCommand, RequestCode, ResponseCode
from .metadata import BrokerMetadata
from .registration import Registration

__all__ = ["SlaveSync", "SlaveSyncStatistics", "SyncOutcome", "hand_over_offsets",
           "sync_from_master"]

log = logging.getLogger(__name__)

#: RocketMQ's first sync comes 3 s after the broker starts
FIRST_SYNC_DELAY = 3.0
#: each GET_ALL_* call (BrokerOuterAPI: 3000 ms)
SYNC_REQUEST_TIMEOUT = 3.0
#: offsets handed over to the master in one round, one request each: a round stays seconds
#: long even when clients filled the table with commits to the slave; the rest go next round
MAX_HANDOVER_PER_ROUND = 10_000


@attrs.frozen
class SyncOutcome:
    """How the last sync of one table went."""

    #: when it was tried (seconds since the epoch)
    at: float
    ok: bool
    #: "changed", "unchanged", or why it failed (the master's refusal or the error)
    detail: str


@attrs.frozen
class SlaveSyncStatistics:
    #: the master synced from last (None: none known yet)
    master: str | None
    rounds: int
    #: table ("topics", "consumer_offsets", "delay_offsets", "subscription_groups") -> the
    #: outcome of its last sync; "offset_handover": the last handover of offsets committed
    #: here to the master
    tables: dict[str, SyncOutcome]


def _tables(metadata: BrokerMetadata, fetched: dict[str, Any]
            ) -> list[tuple[str, RequestCode, Callable[[bytes], bool]]]:
    """What a round fetches, in RocketMQ's order, and how each is taken (the master's consumer
    offsets are also left in ``fetched``, for the handover)."""

    def take_offsets(body: bytes) -> bool:
        table = fetched["consumer_offsets"] = decode_consumer_offsets(body)
        return metadata.offsets.merge_from_master(table) > 0

    return [
        ("topics", RequestCode.GET_ALL_TOPIC_CONFIG,
         lambda body: metadata.topics.replace_from_master(decode_topics_json(body))),
        ("consumer_offsets", RequestCode.GET_ALL_CONSUMER_OFFSET, take_offsets),
        ("delay_offsets", RequestCode.GET_ALL_DELAY_OFFSET,
         lambda body: metadata.delay_offsets.replace_from_master(decode_delay_offsets(body))),
        ("subscription_groups", RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
         lambda body: metadata.subscriptions.replace_from_master(
             decode_subscription_groups(body))),
    ]


async def sync_from_master(pool: RemotingClientPool, master: str, metadata: BrokerMetadata,
                           queue_max: Callable[[str, int], int] | None = None,
                           ) -> dict[str, SyncOutcome]:
    """One round: each table is fetched and taken in turn; a table the master refuses, or
    whose request or body fails, is left as it is and the others still sync. Then the offsets
    committed here that the master lacks are handed over to it (``queue_max``: this slave's
    end of a queue, which caps them). Returns each table's outcome, and the handover's
    ("offset_handover") when there was one."""
    outcomes = {}
    fetched: dict[str, Any] = {}
    for name, code, take in _tables(metadata, fetched):
        at = time.time()
        try:
            response = await pool.invoke(master, RemotingCommand.request(code),
                                         SYNC_REQUEST_TIMEOUT)
            if response.code != ResponseCode.SUCCESS:
                outcome = SyncOutcome(at, False, f"refused: {response.remark or response.code}")
            else:
                outcome = SyncOutcome(at, True, "changed" if take(response.body) else "unchanged")
        except (RemotingError, RouteDecodeError, MetadataDecodeError) as exc:
            outcome = SyncOutcome(at, False, str(exc))
        if not outcome.ok:
            log.info("broker: syncing %s from %s failed: %s", name, master, outcome.detail)
        outcomes[name] = outcome
    if "consumer_offsets" in fetched:
        handover = await hand_over_offsets(pool, master, metadata,
                                           fetched["consumer_offsets"], queue_max)
        if handover is not None:
            outcomes["offset_handover"] = handover
    return outcomes


async def hand_over_offsets(pool: RemotingClientPool, master: str, metadata: BrokerMetadata,
                            masters: ConsumerOffsetTable,
                            queue_max: Callable[[str, int], int] | None = None,
                            ) -> SyncOutcome | None:
    """Send ``master`` each offset committed on this slave that is ahead of its table
    ``masters`` (UPDATE_CONSUMER_OFFSET), capped at the master's end of the queue too (a
    master that lost its log's tail in a crash has a shorter queue than this slave). One the
    master takes, or refuses (its topic or group is gone there), is not sent again; one whose
    request fails is tried at the next round. Logs one line for the lot. None when there was
    nothing to hand over."""
    offsets = metadata.offsets
    pending = offsets.handover(masters, queue_max)[:MAX_HANDOVER_PER_ROUND]
    if not pending:
        return None
    at = time.time()
    taken, capped, refused, failed = 0, 0, [], None
    for key, queue_id, offset in pending:
        topic, group = split_offset_key(key)
        try:
            end = await pool.invoke(master, RemotingCommand.request(
                RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": queue_id}),
                SYNC_REQUEST_TIMEOUT)
            if end.code == ResponseCode.SUCCESS:
                their_end = int(end.ext_fields.get("offset", offset))
                if their_end < offset:
                    # the master has fewer messages than the consumer read here: its end is
                    # the furthest it can be moved, and that will not change by waiting
                    capped += 1
                    offset = their_end
                    offsets.forget_for_master(key, queue_id)
            held = masters.offset_table.get(key, {}).get(queue_id)
            if held is not None and held >= offset:
                continue
            response = await pool.invoke(master, RemotingCommand.request(
                RequestCode.UPDATE_CONSUMER_OFFSET, {
                    "consumerGroup": group, "topic": topic, "queueId": queue_id,
                    "commitOffset": offset}), SYNC_REQUEST_TIMEOUT)
        except (RemotingError, ValueError) as exc:
            failed = str(exc)  # the master went again: the rest wait for the next round
            break
        offsets.handed_over(key, queue_id, offset)
        if response.code == ResponseCode.SUCCESS:
            taken += 1
        else:
            refused.append(f"{key}/{queue_id}: {response.remark or response.code}")
    detail = f"{taken} of {len(pending)} taken"
    if capped:
        detail += f", {capped} capped at the master's shorter queue"
    if refused:
        detail += f"; {len(refused)} refused (first: {refused[0]})"
    if failed is not None:
        detail += f"; the rest wait for the next round: {failed}"
    log.info("broker: handed consumer offsets committed here while the master was away to %s: "
             "%s", master, detail)
    return SyncOutcome(at, failed is None and not refused, detail)


@attrs.define(eq=False)
class SlaveSync:
    """A slave's metadata sync: ``run`` is its task; ``statistics()`` says how it goes."""

    registration: Registration
    metadata: BrokerMetadata
    #: seconds between rounds (slaveSyncInterval)
    interval: float
    #: this slave's end of a queue (topic, queue id -> offset), which caps the offsets handed
    #: over to the master; None: uncapped
    queue_max: Callable[[str, int], int] | None = None
    _master: str | None = None
    _rounds: int = 0
    _tables: dict[str, SyncOutcome] = attrs.field(factory=dict)

    async def run(self) -> None:
        """Sync from the master every ``interval`` seconds, until cancelled."""
        await trio.sleep(min(FIRST_SYNC_DELAY, self.interval))
        while True:
            master = self.registration.master_addr
            if master and master != self.registration.broker_addr:
                self._master = master
                self._rounds += 1
                self._tables.update(
                    await sync_from_master(self.registration.pool, master, self.metadata,
                                           self.queue_max))
            await trio.sleep(self.interval)

    def statistics(self) -> SlaveSyncStatistics:
        return SlaveSyncStatistics(self._master, self._rounds, dict(self._tables))
