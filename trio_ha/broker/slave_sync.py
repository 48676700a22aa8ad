"""A slave copies its master's metadata (RocketMQ's SlaveSynchronize).

Every ``slaveSyncInterval`` (first after a few seconds) a slave that knows its master — learned
through registration — fetches the master's topics, consumer offsets, delay offsets and
subscription groups (GET_ALL_*) and takes them: topics and groups wholesale when the master's
DataVersion differs, delay offsets as they are, consumer offsets merged so that none moves
back (RocketMQ issue #1094; see ``metadata.consumer_offsets``). The store's replication copies
the messages themselves; this copies what a consumer needs to carry on at the slave when the
master is gone. A table whose sync fails is logged and tried again at the next interval; the
others are not held up by it. ``SlaveSync.statistics()`` tells, per table, when it was last
synced and how that went.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import attrs
import trio

from ..remoting import RemotingClientPool, RemotingError
from ..wire.errors import MetadataDecodeError, RouteDecodeError
from ..wire.metadata import (
    decode_consumer_offsets,
    decode_delay_offsets,
    decode_subscription_groups,
    decode_topics_json,
)
from ..wire.remoting import RemotingCommand, RequestCode, ResponseCode
from .metadata import BrokerMetadata
from .registration import Registration

__all__ = ["SlaveSync", "SlaveSyncStatistics", "SyncOutcome", "sync_from_master"]

log = logging.getLogger(__name__)

#: RocketMQ's first sync comes 3 s after the broker starts
FIRST_SYNC_DELAY = 3.0
#: each GET_ALL_* call (BrokerOuterAPI: 3000 ms)
SYNC_REQUEST_TIMEOUT = 3.0


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
    #: outcome of its last sync
    tables: dict[str, SyncOutcome]


def _tables(metadata: BrokerMetadata) -> list[tuple[str, RequestCode, Callable[[bytes], bool]]]:
    """What a round fetches, in RocketMQ's order, and how each is taken."""
    return [
        ("topics", RequestCode.GET_ALL_TOPIC_CONFIG,
         lambda body: metadata.topics.replace_from_master(decode_topics_json(body))),
        ("consumer_offsets", RequestCode.GET_ALL_CONSUMER_OFFSET,
         lambda body: metadata.offsets.merge_from_master(decode_consumer_offsets(body)) > 0),
        ("delay_offsets", RequestCode.GET_ALL_DELAY_OFFSET,
         lambda body: metadata.delay_offsets.replace_from_master(decode_delay_offsets(body))),
        ("subscription_groups", RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
         lambda body: metadata.subscriptions.replace_from_master(
             decode_subscription_groups(body))),
    ]


async def sync_from_master(pool: RemotingClientPool, master: str,
                           metadata: BrokerMetadata) -> dict[str, SyncOutcome]:
    """One round: each table is fetched and taken in turn; a table the master refuses, or
    whose request or body fails, is left as it is and the others still sync. Returns each
    table's outcome."""
    outcomes = {}
    for name, code, take in _tables(metadata):
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
    return outcomes


@attrs.define(eq=False)
class SlaveSync:
    """A slave's metadata sync: ``run`` is its task; ``statistics()`` says how it goes."""

    registration: Registration
    metadata: BrokerMetadata
    #: seconds between rounds (slaveSyncInterval)
    interval: float
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
                    await sync_from_master(self.registration.pool, master, self.metadata))
            await trio.sleep(self.interval)

    def statistics(self) -> SlaveSyncStatistics:
        return SlaveSyncStatistics(self._master, self._rounds, dict(self._tables))
