"""GroupTransferService: answers SYNC_MASTER puts as their bytes reach enough slaves.

A SYNC_MASTER put is PUT_OK once ``ha_sync_acks`` slaves have acknowledged an offset at or
past the end of its record. The HA service keeps that offset as its ``replicated`` watermark
(per connection acks, never one global maximum: see ``master``); this service answers the
waiting puts from it (``SyncRequestService`` tells how, and why a channel replaces RocketMQ's
requestsWrite/requestsRead swap): completed in offset order as ``replicated`` rises,
FLUSH_SLAVE_TIMEOUT at each request's deadline (slaveTimeout).

SLAVE_NOT_AVAILABLE is decided as RocketMQ's isSlaveOK decides it, when the put makes its
request: if too few live slaves are within haSlaveFallbehindMax of the put's end, the put is
told so at once and waits for nothing. A request that was accepted is not re-judged later: a
slave that goes away leaves it to its deadline (FLUSH_SLAVE_TIMEOUT), as in RocketMQ.

The service also tells the HA service which put waits longest (``oldest_waiting``): a slave
connection's acks may answer a put only if that connection carried every byte of it, and the
oldest waiting put is the one that decides (``master``, *which acks count*). It reads that
from the front of the service's one queue of waiting requests, which is in append order.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from ...config import StoreConfig
from ...watermark import Watermark
from ..results import PutMessageStatus
from ..sync_requests import SyncRequest, SyncRequestService


@attrs.frozen
class WaitingPut:
    """The oldest SYNC_MASTER put still waiting for slaves: its bytes start at or after
    ``floor`` (the end of the put that appended just before it) and end at ``end``; it is
    answered by ``deadline`` (trio time) at the latest."""

    floor: int
    end: int
    deadline: float


@attrs.define(eq=False)
class GroupTransferService(SyncRequestService):
    """Answers SYNC_MASTER puts from the HA service's ``replicated`` watermark."""

    #: whether enough slaves are close enough to ``end`` to be worth waiting for
    is_slave_ok: Callable[[int], bool] = attrs.field(kw_only=True)

    @classmethod
    def for_replicas(
        cls, replicated: Watermark, is_slave_ok: Callable[[int], bool], config: StoreConfig
    ) -> GroupTransferService:
        return cls(
            replicated, config.slave_timeout / 1000, PutMessageStatus.FLUSH_SLAVE_TIMEOUT,
            config.sync_request_channel_capacity, is_slave_ok=is_slave_ok,
        )

    def request(self, end: int, start: float) -> SyncRequest:
        if self.watermark.value < end and not self.is_slave_ok(end):
            request = SyncRequest(self, end, start, start)
            request.set(PutMessageStatus.SLAVE_NOT_AVAILABLE)
            self._answered_at_once(request)
            return request
        return super().request(end, start)

    def oldest_waiting(self) -> WaitingPut | None:
        """The oldest put not answered yet, or None when no put waits (then every put still
        to come appends after the log's current end). Amortised O(1)."""
        waiting = self._waiting
        while waiting and waiting[0].done:
            self._floor = waiting.popleft().end
        if not waiting:
            return None
        front = waiting[0]
        return WaitingPut(self._floor, front.end, front.deadline)
