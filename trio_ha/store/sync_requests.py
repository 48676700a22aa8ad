"""Sync requests: how a put waits for a guarantee another task keeps, through a channel.

A SYNC_FLUSH put is PUT_OK only once its bytes are synced, a SYNC_MASTER put only once enough
slaves hold them. In RocketMQ the put thread hands a request to the service that keeps the
guarantee (GroupCommitService, GroupTransferService) through two lists under a lock: each
round the service swaps ``requestsWrite`` and ``requestsRead``, walks what it swapped in, and
completes each put's future; the put gives up on its own after its timeout.

Here a put makes a ``SyncRequest`` — the end offset it needs and its deadline — and sends it
into the service's bounded trio memory channel, then waits for the answer; the channel takes
the place of the swap, and the service drains it in batches. What the channel brings that the
lists did not:

* Back-pressure. The service holds at most ``capacity`` requests and the channel buffers as
  many again; a put beyond that waits to get its request in (trio queues such senders in
  order) instead of growing a list without bound. Nothing is dropped.
* Order without sorting. A put makes its request right after its append, with no checkpoint
  in between, and trio's channels are FIFO, so requests arrive in offset order — which is
  deadline order too, every deadline being "now + the same timeout". The service keeps them
  in a deque and looks only at its front: when the watermark rises it completes the covered
  prefix, at the front's deadline it times out the expired prefix. (One request can be
  taken late: the one the channel handed straight to the idle task, when a rise took the
  requests behind it before the task ran. It is inserted in place.)
* No polling, and no extra task switch. The service listens to its watermark: a rise takes
  what waits in the channel and answers the requests it covers right there, so a put wakes
  in the same scheduling round as the rise, as if it waited on the watermark itself. The
  service's task only keeps time: it sleeps until the front request's deadline (a rise that
  changes the front moves that deadline), and waits on the channel when it holds nothing.
  When a rise has answered everything, the task's sleep is left as it was, not cancelled: it
  wakes once at the old deadline, for nothing, instead of once per put to go back to the
  channel. (RocketMQ's GroupTransferService wakes every 10 ms to look.)

Every request is answered, by the service: PUT_OK, or the timeout status at its deadline, or,
when the service stops (the store closes), PUT_OK if its end is covered by then and the
timeout status if not. A put whose caller is cancelled while it waits just stops listening:
its request is answered later to nobody and costs only its slot until its deadline.

Each answer's wait — from the put's request to its answer, timeouts included — is counted in
the service's ``WaitHistogram`` (``wait_histogram``): one clock read per round, a bisect and
two additions per request, so the flush and replication wait distributions cost the put path
next to nothing.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable

import attrs
import trio

from ..watermark import Watermark
from .results import PutMessageResult, PutMessageStatus
from .wait_histogram import WaitHistogram, WaitHistogramSnapshot


@attrs.define(eq=False)
class SyncRequest:
    """One put's wait: answered once, with a status, by the service it was sent to."""

    #: the offset the guarantee must reach (one past the put's last byte)
    end: int
    #: trio time at which the service answers with its timeout status
    deadline: float
    #: trio time at which the put made the request
    made_at: float
    #: the answer, once given
    status: PutMessageStatus | None = None
    #: in the service's channel (False: it did not fit yet; ``send_when_room`` sends it)
    sent: bool = False
    _waiter: trio.lowlevel.Task | None = None
    #: called once, with no arguments, when the answer is given (``PendingPut.when_done``);
    #: it runs in whichever task answers and must not raise
    on_answer: Callable[[], None] | None = None

    def answer(self, status: PutMessageStatus) -> None:
        """Give the answer (the first one counts), wake the put if it waits, and call
        ``on_answer``."""
        if self.status is not None:
            return
        self.status = status
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            trio.lowlevel.reschedule(waiter)
        callback = self.on_answer
        if callback is not None:
            self.on_answer = None
            callback()

    async def wait_answer(self) -> PutMessageStatus:
        """The answer, once there is one. Parks the task directly (as ``Watermark`` does):
        every SYNC_FLUSH and SYNC_MASTER put waits here."""
        if self.status is None:
            self._waiter = trio.lowlevel.current_task()
            await trio.lowlevel.wait_task_rescheduled(self._stop_listening)
        else:
            await trio.lowlevel.checkpoint()
        status = self.status
        assert status is not None  # rescheduled only by answer()
        return status

    def _stop_listening(self, _raise_cancel: object) -> trio.lowlevel.Abort:
        self._waiter = None
        return trio.lowlevel.Abort.SUCCEEDED


@attrs.define(eq=False)
class PendingPut:
    """A put that is appended and waits for what its store promises: its requests to the
    group commit service (SYNC_FLUSH) and to the group transfer service (SYNC_MASTER),
    made together so both clocks run at once. The put's answer is the later of the two; a
    replica failure overrides the flush status, as RocketMQ's combined futures do.

    Either a task waits for it (``wait``), or a caller that has no task to wait in asks to
    be called back (``when_done``): the broker answers a SYNC_MASTER send that way, from
    the round in which the slave's ack arrives, with no task of its own (issue 11)."""

    appended: PutMessageResult
    durable: tuple[SyncRequestService, SyncRequest] | None = None
    replica: tuple[SyncRequestService, SyncRequest] | None = None
    #: a SYNC_MASTER without replication: no slave can ack (SLAVE_NOT_AVAILABLE)
    no_replicas: bool = False

    @property
    def done(self) -> bool:
        return all(request.status is not None for request in self._requests())

    def result(self) -> PutMessageResult:
        """The put's result, once ``done``."""
        status = PutMessageStatus.PUT_OK
        if self.durable is not None:
            status = self.durable[1].status or status
        if self.replica is not None:
            replicated = self.replica[1].status
            if replicated is not None and replicated is not PutMessageStatus.PUT_OK:
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
        pairs = [pair for pair in (self.durable, self.replica) if pair is not None]
        for service, request in pairs:
            await service.send_when_room(request)
        if self.done:
            await trio.lowlevel.cancel_shielded_checkpoint()
            return self.result()
        for _, request in pairs:
            await request.wait_answer()
        return self.result()

    def when_done(self, callback: Callable[[PutMessageResult], None]) -> bool:
        """Call ``callback(result)`` once, when the last request is answered (now, if they
        all are), from the task that answers it; ``callback`` must not raise. False, and
        nothing registered, when a request did not fit its service's channel: the put must
        ``wait`` in a task, which waits for room there (the channel's back-pressure)."""
        durable, replica = self.durable, self.replica
        if durable is None or replica is None:
            # One service (a SYNC_MASTER's slaves, or SYNC_FLUSH's disk), as most puts that
            # wait have: the same rules without the lists (a broker answers every SYNC send
            # this way).
            pair = replica if durable is None else durable
            if pair is None or pair[1].status is not None:
                callback(self.result())
                return True
            request = pair[1]
            if not request.sent:
                return False
            request.on_answer = lambda: callback(self.result())
            return True
        requests = [durable[1], replica[1]]
        if any(not request.sent and request.status is None for request in requests):
            return False
        waiting = [request for request in requests if request.status is None]
        if not waiting:
            callback(self.result())
            return True

        def answered() -> None:
            if all(request.status is not None for request in waiting):
                callback(self.result())

        for request in waiting:
            request.on_answer = answered
        return True

    def _requests(self) -> list[SyncRequest]:
        return [pair[1] for pair in (self.durable, self.replica) if pair is not None]


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
    _held: deque[SyncRequest] = attrs.field(init=False, factory=deque)
    _completed: int = attrs.field(init=False, default=0)
    _timed_out: int = attrs.field(init=False, default=0)
    #: how long answered requests waited, from their puts' requests to their answers
    _waits: WaitHistogram = attrs.field(init=False, factory=WaitHistogram)
    #: the task's wait for the front request's deadline, while it waits
    _front_wait: trio.CancelScope | None = attrs.field(init=False, default=None)
    #: when the oldest request in the channel was made, if any came since the last round
    _queued_since: float | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        self._send, self._receive = trio.open_memory_channel[SyncRequest](self.capacity)

    # ---- the put's side ------------------------------------------------------------------

    def request(self, end: int, start: float) -> SyncRequest:
        """A request for ``end`` whose clock started at ``start`` (trio time), sent into the
        channel if it has room. Synchronous, so a put can make its requests to both
        services right after its append, then wait for both answers."""
        request = SyncRequest(end, start + self.timeout, start)
        if self.watermark.value >= end:
            request.answer(PutMessageStatus.PUT_OK)
            return request
        try:
            self._send.send_nowait(request)
        except trio.WouldBlock:
            return request  # wait() sends it: the put waits for room there
        except trio.BrokenResourceError:
            request.answer(self._final_status(request))  # the service has stopped
            return request
        request.sent = True
        if self._queued_since is None:
            self._queued_since = start
        return request

    async def wait(self, request: SyncRequest) -> PutMessageStatus:
        """The answer to ``request``; first, if the channel was full, wait for room in it
        (``send_when_room``)."""
        await self.send_when_room(request)
        return await request.wait_answer()

    async def send_when_room(self, request: SyncRequest) -> None:
        """Send a request that did not fit the full channel, once there is room (at most
        until its deadline, which the requests ahead of it reach first). A request that
        leaves here unsent — its deadline passed, or its put was cancelled while it waited
        for room — is answered with the timeout status at once: nobody else would ever
        answer it, and the group transfer service would take it for the oldest put still
        waiting for good (a slave would never count again; fixed with issue 11's review)."""
        if request.sent or request.status is not None:
            return
        try:
            with trio.move_on_at(request.deadline):
                try:
                    await self._send.send(request)
                    request.sent = True
                except trio.BrokenResourceError:
                    request.answer(self._final_status(request))  # the service has stopped
        finally:
            if request.status is None and not request.sent:
                request.answer(self.timeout_status)
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
        held = self._held
        while True:
            if not held:
                self._take(await self._receive.receive())
            self._round()
            if held:
                # Rises are answered by _on_rise, which also moves this deadline when the
                # front changes.
                with trio.CancelScope(deadline=held[0].deadline) as self._front_wait:
                    await trio.sleep_forever()
                self._front_wait = None

    def _on_rise(self, value: int) -> None:
        held = self._held
        if held:
            if held[0].end > value:
                return  # nothing held is covered, and what is in the channel comes after it
        elif self._queued_since is None:
            return  # nothing held, nothing sent since the last round
        self._round()

    def _round(self) -> None:
        """Take what the channel holds, up to the capacity, and answer what the watermark
        covers and what is past its deadline; again while that makes room and the channel
        has more. Then tell the task's wait where the front's deadline is now."""
        held = self._held
        receive = self._receive
        while True:
            drained = False
            while len(held) < self.capacity:
                try:
                    request = receive.receive_nowait()
                except (trio.WouldBlock, trio.ClosedResourceError):
                    drained = True
                    break
                self._take(request)
            before = len(held)
            self._answer_covered_and_expired()
            if drained or len(held) == before:
                break  # the channel is empty, or nothing held could be answered
        # Whatever is left in the channel now is younger than what is held.
        self._queued_since = None
        wait = self._front_wait
        if wait is not None and held:
            wait.deadline = held[0].deadline

    def _take(self, request: SyncRequest) -> None:
        held = self._held
        if held and request.end < held[-1].end:
            bisect.insort(held, request, key=_end)
        else:
            held.append(request)

    def _answer_covered_and_expired(self) -> None:
        held = self._held
        if not held:
            return
        value = self.watermark.value
        now = trio.current_time()
        observe = self._waits.observe
        completed = 0
        while held and held[0].end <= value:
            request = held.popleft()
            request.answer(PutMessageStatus.PUT_OK)
            observe(now - request.made_at)
            completed += 1
        self._completed += completed
        while held and held[0].deadline <= now:
            request = held.popleft()
            request.answer(self.timeout_status)
            observe(now - request.made_at)
            self._timed_out += 1

    def _final_status(self, request: SyncRequest) -> PutMessageStatus:
        if self.watermark.value >= request.end:
            return PutMessageStatus.PUT_OK
        return self.timeout_status

    def _answer_all_and_close(self) -> None:
        """The service stops: answer what it holds, drain the channel (which lets every
        blocked sender in) and answer that too, then close it, so a later request is
        answered at once. Synchronous: it runs while the task is being cancelled."""
        held = self._held
        while True:
            try:
                held.append(self._receive.receive_nowait())
            except (trio.WouldBlock, trio.ClosedResourceError):
                break
        self._receive.close()
        now = trio.current_time()
        while held:
            request = held.popleft()
            status = self._final_status(request)
            request.answer(status)
            self._waits.observe(now - request.made_at)
            if status is PutMessageStatus.PUT_OK:
                self._completed += 1
            else:
                self._timed_out += 1

    def statistics(self) -> SyncServiceStatistics:
        channel = self._receive.statistics()
        held = len(self._held)
        queued = channel.current_buffer_used
        blocked = channel.tasks_waiting_send
        if self._held:
            oldest = trio.current_time() - self._held[0].made_at
        elif self._queued_since is not None:
            oldest = trio.current_time() - self._queued_since
        else:
            oldest = 0.0
        return SyncServiceStatistics(
            pending=held + queued + blocked, held=held, queued=queued, blocked=blocked,
            capacity=self.capacity, oldest_wait=oldest, completed=self._completed,
            timed_out=self._timed_out, waits=self._waits.snapshot(),
        )


def _end(request: SyncRequest) -> int:
    return request.end
