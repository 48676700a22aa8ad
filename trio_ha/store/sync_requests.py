"""Sync requests: how a put waits for a guarantee another task keeps.

A SYNC_FLUSH put is PUT_OK only once its bytes are synced, a SYNC_MASTER put only once enough
slaves hold them. In RocketMQ the put thread hands a request to the service that keeps the
guarantee (GroupCommitService, GroupTransferService) through two lists under a lock, swapped
each round; the service completes each put's future; the put gives up after its timeout.

Here a put makes a ``SyncRequest`` right after its append: an ``Answer`` (``trio_ha.answer``)
to a status, with the end offset it needs and its deadline. Two structures, two jobs:

* The service's queue of waiting answers, in append order. The request joins it as it is
  made, with no checkpoint since the append, so the queue is in offset order, and in deadline
  order too (every deadline is "made + the same timeout"). The service looks only at its
  front: a rise of its watermark answers the covered prefix PUT_OK, the front's deadline
  answers the expired prefix with the timeout status.
* Admission, for back-pressure only: ``capacity`` slots, then a bounded trio memory channel.
  A request takes a free slot as it is made; when all are taken it goes into the channel,
  which buffers as many again, and beyond that its put waits for room (trio queues such
  senders in order; a put that comes back for room takes a slot if one came free) instead
  of growing a list without bound. As answers free slots, the
  service takes the channel's requests into them, which lets the blocked puts in, in order.
  Nothing is dropped, and the channel's statistics are the service's (queued, blocked). A
  request waiting for admission is in the queue all the same and is answered in its turn;
  its put still waits for room before it goes on.

No polling, and no extra task switch: the service listens to its watermark, and a rise
answers the requests it covers right there, so a put wakes in the same scheduling round as
the rise, as if it waited on the watermark itself. The service's task only keeps time: it
sleeps until the front's deadline (a rise that changes the front moves it), or, when nothing
waits, until a request comes. A rise that answers everything leaves that sleep as it was: it
wakes once at the old deadline, for nothing, rather than once per put. (RocketMQ's
GroupTransferService wakes every 10 ms to look.)

Every request is answered: PUT_OK, or the timeout status at its deadline, or, when the
service stops (the store closes), PUT_OK if its end is covered by then and the timeout status
if not. A put whose caller is cancelled while it waits just stops listening; one cancelled
while it waits for room is answered with the timeout status at once (nobody waits for it).
Each answer's wait is counted in the service's ``WaitHistogram``: one clock read per round,
a bisect and two additions per request.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import attrs
import trio

from ..answer import Answer, wait_all, when_all
from ..watermark import Watermark
from .results import PutMessageResult, PutMessageStatus
from .wait_histogram import WaitHistogram, WaitHistogramSnapshot


@attrs.define(eq=False)
class SyncRequest(Answer[PutMessageStatus]):
    """One put's wait for one guarantee: answered once, with a status, by ``service``."""

    service: SyncRequestService
    #: the offset the guarantee must reach (one past the put's last byte)
    end: int
    #: trio time at which the service answers with its timeout status
    deadline: float
    #: trio time at which the put made the request
    made_at: float
    #: admitted: in one of the service's slots or in its channel (False: it did not fit yet,
    #: and its put waits for room in ``send_when_room``)
    sent: bool = False
    #: in one of the service's ``capacity`` slots (freed when it is answered)
    held: bool = False

    @property
    def status(self) -> PutMessageStatus | None:
        """The answer, or None before it is given."""
        return self.value if self.done else None


@attrs.define(eq=False)
class PendingPut:
    """A put that is appended and waits for what its store promises: its requests to the
    group commit service (SYNC_FLUSH) and to the group transfer service (SYNC_MASTER),
    made together so both clocks run at once. The put's answer is the later of the two; a
    replica failure overrides the flush status, as RocketMQ's combined futures do.

    Either a task waits for it (``wait``), or a caller that has no task to wait in asks to
    be called back (``when_done``): the broker answers a SYNC_MASTER send that way, from
    the round in which the slave's ack arrives, with no task of its own."""

    appended: PutMessageResult
    durable: SyncRequest | None = None
    replica: SyncRequest | None = None
    #: a SYNC_MASTER without replication: no slave can ack (SLAVE_NOT_AVAILABLE)
    no_replicas: bool = False

    @property
    def done(self) -> bool:
        durable, replica = self.durable, self.replica
        return (durable is None or durable.done) and (replica is None or replica.done)

    def result(self) -> PutMessageResult:
        """The put's result, once ``done``."""
        status = PutMessageStatus.PUT_OK
        if self.durable is not None:
            status = self.durable.value
        if self.replica is not None:
            replicated = self.replica.value
            if replicated is not PutMessageStatus.PUT_OK:
                status = replicated
        elif self.no_replicas:
            status = PutMessageStatus.SLAVE_NOT_AVAILABLE
        if status is PutMessageStatus.PUT_OK:
            return self.appended
        return attrs.evolve(self.appended, status=status)

    async def wait(self) -> PutMessageResult:
        """The result, once both services have answered. Requests that did not fit their
        channels are sent first, both, so neither waits behind the other's answer. A put
        answered already (covered, or SLAVE_NOT_AVAILABLE at once) is not cancellable: it
        happened and waits for nothing."""
        requests = (self.durable, self.replica)
        for request in requests:
            if request is not None:
                await request.service.send_when_room(request)
        if self.done:
            await trio.lowlevel.cancel_shielded_checkpoint()
        else:
            await wait_all(requests)
        return self.result()

    def when_done(self, callback: Callable[[PutMessageResult], None]) -> bool:
        """Call ``callback(result)`` once, when the last request is answered (now, if they
        all are), from the task that answers it; ``callback`` must not raise. False, and
        nothing registered, when a request did not fit its service's channel: the put must
        ``wait`` in a task, which waits for room there (the channel's back-pressure)."""
        requests = (self.durable, self.replica)
        for request in requests:
            if request is not None and not (request.sent or request.done):
                return False  # not admitted
        when_all(requests, lambda: callback(self.result()))
        return True


@attrs.frozen
class SyncServiceStatistics:
    #: requests made and not answered yet: held + queued + blocked
    pending: int
    #: requests the service holds, waiting on the watermark or their deadline
    held: int
    #: requests in the channel, not taken by the service yet
    queued: int
    #: puts waiting for room in the full channel (the back-pressure at work)
    blocked: int
    #: the most the service holds, and the channel's buffer size
    capacity: int
    #: seconds the oldest pending request has waited (0.0 when none is pending)
    oldest_wait: float
    #: requests answered PUT_OK, and with the timeout status, since the start
    completed: int
    timed_out: int
    #: how long the answered requests waited (``completed + timed_out`` of them), seconds
    waits: WaitHistogramSnapshot = attrs.field(factory=lambda: WaitHistogram().snapshot())


@attrs.define(eq=False)
class SyncRequestService:
    """Answers SyncRequests as ``watermark`` rises past their ends, or at their deadlines
    with ``timeout_status``. ``run`` is its task; puts call ``request`` then ``wait``."""

    watermark: Watermark
    #: seconds a request may wait, from the moment its put made it
    timeout: float
    timeout_status: PutMessageStatus
    capacity: int
    _send: trio.MemorySendChannel[SyncRequest] = attrs.field(init=False)
    _receive: trio.MemoryReceiveChannel[SyncRequest] = attrs.field(init=False)
    #: every request since the oldest unanswered one, in append order (one answered out of
    #: turn, by its put, is dropped when it reaches the front)
    _waiting: deque[SyncRequest] = attrs.field(init=False, factory=deque[SyncRequest])
    #: the end of the last request dropped from the front: where the front's bytes start at
    #: the earliest (0 before any: nothing is assumed about a put that came before)
    _floor: int = attrs.field(init=False, default=0)
    #: how many of the ``capacity`` slots hold a request (admitted, unanswered)
    _held: int = attrs.field(init=False, default=0)
    #: the task, when nothing waits, waits here for a request
    _idle: trio.lowlevel.ParkingLot = attrs.field(init=False, factory=trio.lowlevel.ParkingLot)
    #: the service has stopped: a request is answered as it is made
    _stopped: bool = attrs.field(init=False, default=False)
    _completed: int = attrs.field(init=False, default=0)
    _timed_out: int = attrs.field(init=False, default=0)
    #: how long answered requests waited, from their puts' requests to their answers
    _waits: WaitHistogram = attrs.field(init=False, factory=WaitHistogram)
    #: the task's wait for the front request's deadline, while it waits
    _front_wait: trio.CancelScope | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        self._send, self._receive = trio.open_memory_channel[SyncRequest](self.capacity)

    # ---- the put's side ------------------------------------------------------------------

    def request(self, end: int, start: float) -> SyncRequest:
        """A request for ``end`` whose clock started at ``start`` (trio time), admitted if
        there is room: a free slot, or else the channel. Synchronous, so a put can make its
        requests to both services right after its append, then wait for both answers."""
        request = SyncRequest(self, end, start + self.timeout, start)
        if self.watermark.value >= end:
            request.set(PutMessageStatus.PUT_OK)
            self._answered_at_once(request)
            return request
        if self._stopped:
            request.set(self.timeout_status)  # (not covered: its final status)
            return request
        waiting = self._waiting
        if self._held < self.capacity:
            request.sent = request.held = True
            self._held += 1
            if not waiting and self._idle:
                self._idle.unpark()
        else:
            try:
                self._send.send_nowait(request)
                request.sent = True
            except trio.WouldBlock:
                pass  # wait() sends it: the put waits for room there
        waiting.append(request)
        return request

    def _answered_at_once(self, request: SyncRequest) -> None:
        """Keep the append order of a request answered as it was made: behind the waiting
        ones, or, when none waits, as the new floor."""
        if self._waiting:
            self._waiting.append(request)
        else:
            self._floor = request.end

    async def wait(self, request: SyncRequest) -> PutMessageStatus:
        """The answer to ``request``; first, if the channel was full, wait for room in it
        (``send_when_room``)."""
        await self.send_when_room(request)
        return await request.wait()

    async def send_when_room(self, request: SyncRequest) -> None:
        """Send a request that did not fit the full channel, once there is room (at most
        until its deadline, which the requests ahead of it reach first). A request that
        leaves here unsent — its deadline passed, or its put was cancelled while it waited
        for room — is answered with the timeout status at once: it would otherwise stand at
        the front until its deadline, and the group transfer service would take it for the
        oldest put still waiting (so no slave could count)."""
        if request.sent or request.done:
            return
        if self._held < self.capacity and not self._stopped:
            # Slots came free since the request was made (and then nobody waits for room).
            request.sent = request.held = True
            self._held += 1
            return
        try:
            with trio.move_on_at(request.deadline):
                try:
                    await self._send.send(request)
                    request.sent = True
                except trio.BrokenResourceError:
                    request.set(self._final_status(request))  # the service has stopped
        finally:
            if not request.sent and request.set(self.timeout_status):
                self._timed_out += 1
                self._waits.observe(trio.current_time() - request.made_at)

    # ---- the service's side --------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Answer requests until cancelled; then answer every one still pending."""
        self.watermark.add_listener(self._on_rise)
        try:
            task_status.started()
            await self._answer_requests()
        finally:
            self.watermark.remove_listener(self._on_rise)
            self._answer_all_and_close()

    async def _answer_requests(self) -> None:
        waiting = self._waiting
        while True:
            if not waiting:
                await self._idle.park()  # until request() adds one
            self._round()
            if waiting:
                # Rises are answered by _on_rise, which also moves this deadline when the
                # front changes.
                with trio.CancelScope(deadline=waiting[0].deadline) as self._front_wait:
                    await trio.sleep_forever()
                self._front_wait = None

    def _on_rise(self, value: int) -> None:
        waiting = self._waiting
        if waiting and waiting[0].end <= value:
            self._round()

    def _round(self) -> None:
        """Take what the channel holds into the free slots, and answer the front: what the
        watermark covers and what is past its deadline; again while that frees slots and
        the channel has more (which lets the puts blocked on it in). Then tell the task's
        wait where the front's deadline is now."""
        while True:
            drained = self._take_admitted()
            if not self._answer_front() or drained:
                break  # nothing left the queue (no slot freed), or nothing more to take
        waiting = self._waiting
        wait = self._front_wait
        if wait is not None and waiting:
            wait.deadline = waiting[0].deadline

    def _take_admitted(self) -> bool:
        """Take requests from the channel while a slot is free; True once it is empty."""
        receive = self._receive
        while self._held < self.capacity:
            try:
                request = receive.receive_nowait()
            except (trio.WouldBlock, trio.ClosedResourceError):
                return True
            if not request.done:  # (one answered while in the channel only leaves it)
                request.held = True
                self._held += 1
        return False

    def _answer_front(self) -> bool:
        """Answer the covered and the expired prefix of the waiting requests, and drop them
        (with those answered out of turn); whether any left the queue."""
        waiting = self._waiting
        value = self.watermark.value
        now = trio.current_time()
        observe = self._waits.observe
        completed = timed_out = freed = 0
        last = None
        while waiting:
            request = waiting[0]
            if request.end <= value:
                if request.set(PutMessageStatus.PUT_OK):
                    completed += 1
                    observe(now - request.made_at)
            elif request.deadline <= now:
                if request.set(self.timeout_status):
                    timed_out += 1
                    observe(now - request.made_at)
            elif not request.done:
                break
            freed += request.held
            waiting.popleft()
            last = request
        if last is None:
            return False
        self._floor = last.end
        self._held -= freed
        self._completed += completed
        self._timed_out += timed_out
        return True

    def _final_status(self, request: SyncRequest) -> PutMessageStatus:
        if self.watermark.value >= request.end:
            return PutMessageStatus.PUT_OK
        return self.timeout_status

    def _answer_all_and_close(self) -> None:
        """The service stops: drain the channel (which lets every blocked sender in), close
        it, and answer every request waiting; a later request is answered as it is made.
        Synchronous: it runs while the task is being cancelled."""
        self._stopped = True
        while True:
            try:
                self._receive.receive_nowait()
            except (trio.WouldBlock, trio.ClosedResourceError):
                break
        self._receive.close()
        self._held = 0
        now = trio.current_time()
        waiting = self._waiting
        while waiting:
            request = waiting.popleft()
            self._floor = request.end
            status = self._final_status(request)
            if not request.set(status):
                continue
            self._waits.observe(now - request.made_at)
            if status is PutMessageStatus.PUT_OK:
                self._completed += 1
            else:
                self._timed_out += 1

    def statistics(self) -> SyncServiceStatistics:
        channel = self._receive.statistics()
        held = self._held
        queued = channel.current_buffer_used
        blocked = channel.tasks_waiting_send
        oldest = 0.0
        for request in self._waiting:
            if not request.done:
                oldest = trio.current_time() - request.made_at
                break
        return SyncServiceStatistics(
            pending=held + queued + blocked, held=held, queued=queued, blocked=blocked,
            capacity=self.capacity, oldest_wait=oldest, completed=self._completed,
            timed_out=self._timed_out, waits=self._waits.snapshot(),
        )
