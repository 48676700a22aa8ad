"""A slave copies its master's metadata (RocketMQ's SlaveSynchronize).

Every ``slaveSyncInterval`` (first after a few seconds) a slave that knows its master — learned
through registration — fetches the master's topics, consumer offsets, delay offsets and
subscription groups (GET_ALL_*) and takes them: topics and groups wholesale when the master's
DataVersion differs, delay offsets as they are, consumer offsets merged so that none moves
back (RocketMQ issue #1094; see ``metadata.consumer_offsets``). The store's replication copies
the messages themselves; this copies what a consumer needs to carry on at the slave when the
master is gone. A failed round is logged and tried again at the next interval.
"""

from __future__ import annotations

import logging

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

__all__ = ["run_slave_sync", "sync_from_master"]

log = logging.getLogger(__name__)

#: RocketMQ's first sync comes 3 s after the broker starts
FIRST_SYNC_DELAY = 3.0
#: each GET_ALL_* call (BrokerOuterAPI: 3000 ms)
SYNC_REQUEST_TIMEOUT = 3.0


async def run_slave_sync(registration: Registration, metadata: BrokerMetadata,
                         interval: float) -> None:
    """Sync from the master every ``interval`` seconds, until cancelled."""
    await trio.sleep(min(FIRST_SYNC_DELAY, interval))
    while True:
        master = registration.master_addr
        if master and master != registration.broker_addr:
            try:
                await sync_from_master(registration.pool, master, metadata)
            except (RemotingError, RouteDecodeError, MetadataDecodeError) as exc:
                log.info("broker: metadata sync from %s failed: %s", master, exc)
        await trio.sleep(interval)


async def sync_from_master(pool: RemotingClientPool, master: str,
                           metadata: BrokerMetadata) -> None:
    """One round: each table is fetched and taken in turn; a refused request skips its
    table."""

    async def fetch(code: RequestCode) -> bytes | None:
        response = await pool.invoke(master, RemotingCommand.request(code), SYNC_REQUEST_TIMEOUT)
        return response.body if response.code == ResponseCode.SUCCESS else None

    if (body := await fetch(RequestCode.GET_ALL_TOPIC_CONFIG)) is not None:
        metadata.topics.replace_from_master(decode_topics_json(body))
    if (body := await fetch(RequestCode.GET_ALL_CONSUMER_OFFSET)) is not None:
        metadata.offsets.merge_from_master(decode_consumer_offsets(body))
    if (body := await fetch(RequestCode.GET_ALL_DELAY_OFFSET)) is not None:
        metadata.delay_offsets.replace_from_master(decode_delay_offsets(body))
    if (body := await fetch(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)) is not None:
        metadata.subscriptions.replace_from_master(decode_subscription_groups(body))
