"""GroupTransferService: answers SYNC_MASTER puts as their bytes reach enough slaves.

A SYNC_MASTER put is PUT_OK once ``ha_sync_acks`` slaves have acknowledged an offset at or
past the end of its record. The HA service keeps that offset as its ``replicated`` watermark
(per connection acks, never one global maximum: see ``master``); this service answers the
waiting puts from it. Puts come in through a bounded memory channel (``SyncRequestService``
tells how, and why it replaces RocketMQ's requestsWrite/requestsRead swap): completed in
offset order as ``replicated`` rises, FLUSH_SLAVE_TIMEOUT at each request's deadline
(slaveTimeout).

SLAVE_NOT_AVAILABLE is decided as RocketMQ's isSlaveOK decides it, when the put makes its
request: if too few live slaves are within haSlaveFallbehindMax of the put's end, the put is
told so at once and waits for nothing. A request that was accepted is not re-judged later: a
slave that goes away leaves it to its deadline (FLUSH_SLAVE_TIMEOUT), as in RocketMQ.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from ...config import StoreConfig
from ...watermark import Watermark
from ..results import PutMessageStatus
from ..sync_requests import SyncRequest, SyncRequestService


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
            request = SyncRequest(end, start, start)
            request.answer(PutMessageStatus.SLAVE_NOT_AVAILABLE)
            return request
        return super().request(end, start)
