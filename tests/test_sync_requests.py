"""Group commit and group transfer: puts wait through a bounded memory channel of requests.

Most of these run the services alone, on a Watermark the test raises, with trio's autojump
clock (no threads are involved, so virtual seconds are exact): deadlines, order, back-pressure,
cancellation and close. The last ones run through a real store (worker threads: real time).
"""

import attrs
import pytest
import trio
import trio.testing

from conftest import wait_until
from trio_ha import BrokerRole, FlushDiskType, Message, PutMessageStatus, StoreConfig, open_store
from trio_ha.store import MessageStore
from trio_ha.store.group_commit import GroupCommitService
from trio_ha.store.ha.group_transfer import GroupTransferService
from trio_ha.store.ha.master import SlaveConnectionStatistics
from trio_ha.store.results import PutMessageResult
from trio_ha.store.sync_requests import PendingPut, SyncRequestService, SyncServiceStatistics
from trio_ha.watermark import Watermark
from trio_ha.wire.ha import SlaveProtocol

OK = PutMessageStatus.PUT_OK
TIMEOUT = PutMessageStatus.FLUSH_DISK_TIMEOUT


def service(capacity: int = 8, timeout: float = 5.0) -> SyncRequestService:
    return SyncRequestService(Watermark(), timeout, TIMEOUT, capacity)


class Log:
    """Hands out record ends in the order puts run, as appends do (trio may start a batch
    of tasks in any order)."""

    def __init__(self) -> None:
        self.end = 0

    def append(self) -> int:
        self.end += 1
        return self.end


async def put(svc: SyncRequestService, end: int | Log, answers: dict[int, tuple[PutMessageStatus, float]],
              *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED):
    """What a put does after its append: request, then wait for the answer. Requests are made
    in append order, as a store's puts make them right after their appends: start puts of
    given ends with ``nursery.start`` (started once the request is made), or take their ends
    from a ``Log``."""
    if isinstance(end, Log):
        end = end.append()
    request = svc.request(end, trio.current_time())
    task_status.started()
    answers[end] = (await svc.wait(request), trio.current_time())


async def test_requests_complete_in_offset_order_as_the_watermark_rises(autojump_clock):
    svc = service()
    answers: dict[int, tuple[PutMessageStatus, float]] = {}
    async with trio.open_nursery() as nursery:
        await nursery.start(svc.run)
        for end in (100, 200, 300):
            await nursery.start(put, svc, end, answers)
        await trio.sleep(1)
        svc.watermark.raise_to(250)  # covers the first two only
        await trio.sleep(1)
        assert {end: status for end, (status, _) in answers.items()} == {100: OK, 200: OK}
        assert all(at == 1.0 for _, at in answers.values())
        assert svc.statistics().held == 1
        svc.watermark.raise_to(300)
        await trio.sleep(0.5)
        assert answers[300] == (OK, 2.0)
        stats = svc.statistics()
        assert (stats.pending, stats.completed, stats.timed_out) == (0, 3, 0)
        nursery.cancel_scope.cancel()


async def test_a_rise_answers_the_requests_it_covers_before_anything_else_runs(autojump_clock):
    """The service listens to its watermark: the puts a rise covers are answered inside
    raise_to, so they wake in the same scheduling round, as direct waiters would."""
    svc = service()
    async with trio.open_nursery() as nursery:
        await nursery.start(svc.run)
        requests = [svc.request(end, trio.current_time()) for end in (10, 20, 30)]
        await trio.sleep(1)  # the service takes them and waits for the front's deadline
        svc.watermark.raise_to(20)
        assert [r.status for r in requests] == [OK, OK, None]
        svc.watermark.raise_to(30)  # the held one, and one still in the channel
        late = svc.request(40, trio.current_time())
        svc.watermark.raise_to(40)
        assert requests[2].status is OK and late.status is OK
        assert svc.statistics().pending == 0
        nursery.cancel_scope.cancel()


async def test_a_request_made_while_the_task_is_idle_is_answered_by_a_rise_in_its_place(
    autojump_clock,
):
    """The channel once decided the order: a request handed straight to the idle task was
    taken after the ones a rise took before the task ran, and had to be inserted in place.
    Now the order is the waiting queue's, made at the request, and a request takes a free
    slot without the channel: the rise answers the first in its place, before the task it
    woke even runs."""
    svc = service(timeout=5.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(svc.run)  # idle: waiting for a request
        first = svc.request(10, trio.current_time())  # wakes the task
        second = svc.request(20, trio.current_time())
        svc.watermark.raise_to(15)  # before the task runs
        assert (first.status, second.status) == (OK, None)  # in the rise itself
        assert svc.statistics().held == 1  # the second
        await trio.testing.wait_all_tasks_blocked()
        assert (first.status, second.status) == (OK, None)
        assert svc.statistics().held == 1
        await trio.sleep(10)
        assert second.status is TIMEOUT
        nursery.cancel_scope.cancel()


async def test_a_request_waiting_for_room_is_answered_in_its_turn(autojump_clock):
    """The channel only admits: a request whose put waits for room is in the service's
    queue all the same, so a rise that covers it answers it in its turn, in the rise, and
    the room that rise makes lets its put in."""
    svc = service(capacity=1)
    answers: dict[int, tuple[PutMessageStatus, float]] = {}
    async with trio.open_nursery() as nursery:
        await nursery.start(svc.run)
        now = trio.current_time()
        first, second, third = (svc.request(end, now) for end in (10, 20, 30))
        assert first.sent and second.sent and not third.sent

        async def wait_third():
            answers[30] = (await svc.wait(third), trio.current_time())

        nursery.start_soon(wait_third)
        await trio.sleep(1)
        assert svc.statistics().blocked == 1
        svc.watermark.raise_to(30)
        assert (first.status, second.status, third.status) == (OK, OK, OK)
        await trio.testing.wait_all_tasks_blocked()
        assert answers[30] == (OK, 1.0) and third.sent
        stats = svc.statistics()
        assert (stats.pending, stats.completed, stats.timed_out) == (0, 3, 0)
        nursery.cancel_scope.cancel()


async def test_a_request_sent_late_takes_a_slot_that_came_free(autojump_clock):
    """A put whose request found no room waits for it in its own time (the broker's, in a
    task it starts); when slots came free meanwhile, it takes one rather than the channel."""
    svc = service(capacity=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(svc.run)
        now = trio.current_time()
        first, second, third = (svc.request(end, now) for end in (10, 20, 30))
        assert not third.sent
        svc.watermark.raise_to(20)
        stats = svc.statistics()
        assert (stats.held, stats.queued, stats.blocked) == (0, 0, 0)
        await svc.send_when_room(third)
        stats = svc.statistics()
        assert third.sent and (stats.held, stats.queued, stats.pending) == (1, 0, 1)
        svc.watermark.raise_to(30)
        assert await svc.wait(third) is OK
        nursery.cancel_scope.cancel()


async def test_a_pending_put_calls_back_once_answered_or_asks_for_a_task_when_the_channel_is_full(
        autojump_clock):
    """Issue 11: a put whose caller has no task to wait in (the broker answers a SYNC send
    from the round its ack arrives in) is called back, once, from the task that raises the
    watermark; a put whose request did not fit the full channel is not (``when_done`` says
    False) and waits in a task, which waits for room there: the channel's back-pressure
    stays whole."""
    svc = service(capacity=1)
    now = trio.current_time()

    def pending(end: int) -> PendingPut:
        appended = PutMessageResult(OK, end - 10, 10)
        return PendingPut(appended, replica=svc.request(end, now))

    called: list[PutMessageResult] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(svc.run)
        # The idle task takes the first, the channel's buffer holds one more: the third is
        # left out until there is room.
        first, middle, second = pending(100), pending(110), pending(200)
        assert first.when_done(called.append) and middle.when_done(called.append)
        assert not second.when_done(called.append)
        results = []

        async def wait_second():
            results.append(await second.wait())

        nursery.start_soon(wait_second)
        await trio.sleep(1)
        assert called == [] and results == []
        svc.watermark.raise_to(150)
        # in the rise itself, not a round later
        assert called == [first.appended, middle.appended]
        svc.watermark.raise_to(200)
        await trio.sleep(0.1)  # its task sends it into the channel once there is room
        assert results == [second.appended] and len(called) == 2
        late = pending(150)  # already covered: called back at once
        assert late.when_done(called.append) and called[-1] is late.appended
        nursery.cancel_scope.cancel()


async def test_a_put_waiting_for_the_disk_and_the_slave_is_called_back_once_both_answer(
        autojump_clock):
    """SYNC_FLUSH and SYNC_MASTER at once: the callback comes once, after the later of the
    two answers, with the replica's failure winning over a good flush; a put whose request
    to either service did not fit its channel asks for a task."""
    disk, slaves = service(), service()
    now = trio.current_time()

    def pending(end: int) -> PendingPut:
        return PendingPut(PutMessageResult(OK, end - 10, 10),
                          durable=disk.request(end, now),
                          replica=slaves.request(end, now))

    called: list[PutMessageResult] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(disk.run)
        await nursery.start(slaves.run)
        put = pending(100)
        assert put.when_done(called.append)
        await trio.testing.wait_all_tasks_blocked()  # both services hold their requests
        disk.watermark.raise_to(100)
        assert called == []  # the slave has not answered yet
        slaves.watermark.raise_to(100)
        assert called == [put.appended]
        timed_out = pending(200)
        assert timed_out.when_done(called.append)
        await trio.testing.wait_all_tasks_blocked()
        disk.watermark.raise_to(200)
        await trio.sleep(6)  # the slave never acks: its service answers at the deadline
        assert len(called) == 2 and called[-1].status is TIMEOUT
        nursery.cancel_scope.cancel()
    full, other = service(capacity=1), service()  # not running: a slot and the channel's one
    full.request(5, now)
    full.request(10, now)
    unsent = PendingPut(PutMessageResult(OK, 10, 10), durable=full.request(20, now),
                        replica=other.request(20, now))
    assert not unsent.when_done(called.append) and len(called) == 2


async def test_each_request_is_answered_at_its_own_deadline(autojump_clock):
    svc = service(timeout=5.0)
    answers: dict[int, tuple[PutMessageStatus, float]] = {}
    async with trio.open_nursery() as nursery:
        await nursery.start(svc.run)
        for i in range(4):  # made at 0, 1, 2, 3 s
            nursery.start_soon(put, svc, 100 * (i + 1), answers)
            await trio.sleep(1)
        await trio.sleep(0.5)
        assert svc.statistics().oldest_wait == pytest.approx(4.5)
        svc.watermark.raise_to(350)  # at 4.5 s: the last one is not covered
        await trio.sleep(10)
        nursery.cancel_scope.cancel()
    assert answers == {
        100: (OK, 4.5), 200: (OK, 4.5), 300: (OK, 4.5), 400: (TIMEOUT, 3.0 + 5.0),
    }


async def test_deadlines_pass_even_while_the_watermark_never_moves(autojump_clock):
    svc = service(timeout=2.0)
    answers: dict[int, tuple[PutMessageStatus, float]] = {}
    async with trio.open_nursery() as nursery:
        await nursery.start(svc.run)
        for i in range(3):
            nursery.start_soon(put, svc, i + 1, answers)
            await trio.sleep(0.25)
        await trio.sleep(5)
        nursery.cancel_scope.cancel()
    assert answers == {1: (TIMEOUT, 2.0), 2: (TIMEOUT, 2.25), 3: (TIMEOUT, 2.5)}
    assert svc.statistics().timed_out == 3


async def test_an_already_covered_end_is_answered_without_the_channel(autojump_clock):
    svc = service()
    svc.watermark.raise_to(1000)
    request = svc.request(500, trio.current_time())
    assert not request.sent and request.status is OK
    assert await svc.wait(request) is OK  # no service running: it never went in


async def test_the_channel_bound_holds_under_10000_concurrent_puts():
    capacity = 16
    svc = service(capacity=capacity, timeout=1000.0)
    answers: dict[int, tuple[PutMessageStatus, float]] = {}
    seen = {"held": 0, "queued": 0, "blocked": 0, "in_service": 0}
    puts = 10_000

    async def watch():
        # Between scheduling rounds (a bounded number of them), what is in flight.
        for _ in range(1_000_000):
            if len(answers) == puts:
                return
            stats = svc.statistics()
            for name in ("held", "queued", "blocked"):
                seen[name] = max(seen[name], getattr(stats, name))
            seen["in_service"] = max(seen["in_service"], stats.held + stats.queued)
            await trio.lowlevel.checkpoint()
        pytest.fail(f"only {len(answers)} of {puts} puts answered")

    async def raise_slowly():
        for end in range(0, puts + 100, 100):
            svc.watermark.raise_to(end)
            for _ in range(3):
                await trio.lowlevel.checkpoint()

    log = Log()
    with trio.fail_after(60):
        async with trio.open_nursery() as services:
            await services.start(svc.run)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch)
                for _ in range(puts):
                    nursery.start_soon(put, svc, log, answers)
                nursery.start_soon(raise_slowly)
            services.cancel_scope.cancel()
    # Every put answered, none lost, none timed out; the service never held more than its
    # capacity, nor the channel buffered more; the rest waited their turn to get in.
    assert sorted(answers) == list(range(1, puts + 1))
    assert {status for status, _ in answers.values()} == {OK}
    assert seen["held"] == capacity and seen["queued"] <= capacity
    assert seen["in_service"] <= 2 * capacity
    assert seen["blocked"] > puts // 2  # the back-pressure was real
    assert svc.statistics().completed == puts


async def test_a_cancelled_put_leaves_the_service_working(autojump_clock):
    svc = service(capacity=2, timeout=5.0)
    answers: dict[int, tuple[PutMessageStatus, float]] = {}
    async with trio.open_nursery() as nursery:
        await nursery.start(svc.run)
        log = Log()
        async with trio.open_nursery() as doomed:
            for _ in range(8):  # 2 held, 2 queued, 4 blocked on the full channel
                doomed.start_soon(put, svc, log, answers)
            await trio.sleep(1)
            assert svc.statistics().blocked == 4
            doomed.cancel_scope.cancel()  # cancelled while waiting, in and out of the channel
        assert answers == {}
        assert svc.statistics().blocked == 0
        svc.watermark.raise_to(4)  # answers the requests that made it in, to nobody
        await trio.sleep(0.1)
        assert svc.statistics().pending == 0
        nursery.start_soon(put, svc, 10, answers)
        await trio.sleep(0.1)
        svc.watermark.raise_to(10)
        await trio.sleep(0.1)
        assert answers[10] == (OK, pytest.approx(1.2))
        nursery.cancel_scope.cancel()


async def test_stopping_answers_every_pending_request_and_later_ones_at_once(autojump_clock):
    svc = service(capacity=2, timeout=100.0)
    answers: dict[int, tuple[PutMessageStatus, float]] = {}
    log = Log()
    async with trio.open_nursery() as puts:
        async with trio.open_nursery() as services:
            await services.start(svc.run)
            for _ in range(8):  # held, queued and blocked ones
                puts.start_soon(put, svc, log, answers)
            await trio.sleep(1)
            svc.watermark.raise_to(3)  # at 1 s: ends 1..3 are covered
            await trio.sleep(1)
            assert svc.statistics().pending == 5
            services.cancel_scope.cancel()  # the store closes
    assert {end: status for end, (status, _) in answers.items()} == {
        1: OK, 2: OK, 3: OK, 4: TIMEOUT, 5: TIMEOUT, 6: TIMEOUT, 7: TIMEOUT, 8: TIMEOUT,
    }
    assert max(at for _, at in answers.values()) == 2.0  # at the close, not the deadlines
    late = svc.request(9, trio.current_time())
    assert await svc.wait(late) is TIMEOUT  # nobody is left to wait for


@attrs.define
class StuckLog:
    """A commitlog whose flush never returns (a hung disk), or, unstuck, syncs at once."""

    written: Watermark = attrs.field(factory=Watermark)
    flushed: Watermark = attrs.field(factory=Watermark)
    stuck: bool = True
    flushes: int = 0

    async def flush(self, least_pages: int = 0) -> int:
        if self.stuck:
            await trio.sleep_forever()
        await trio.sleep(0.001)  # a fast disk
        self.flushes += 1
        self.flushed.raise_to(self.written.value)
        return self.flushed.value


async def test_group_commit_answers_flush_disk_timeout_while_the_sync_hangs(autojump_clock, make_config):
    log = StuckLog()
    svc = GroupCommitService.for_commitlog(log, make_config(sync_flush_timeout=5000))
    answers: dict[int, tuple[PutMessageStatus, float]] = {}
    async with trio.open_nursery() as nursery:
        await nursery.start(svc.run)
        for end in (10, 20):
            log.written.raise_to(end)  # the append
            nursery.start_soon(put, svc, end, answers)
        await trio.sleep(10)
        assert answers == {10: (TIMEOUT, 5.0), 20: (TIMEOUT, 5.0)}
        nursery.cancel_scope.cancel()


async def test_group_commit_serves_many_puts_with_one_sync(autojump_clock, make_config):
    log = StuckLog(stuck=False)
    svc = GroupCommitService.for_commitlog(log, make_config())
    answers: dict[int, tuple[PutMessageStatus, float]] = {}
    async with trio.open_nursery() as nursery:
        await nursery.start(svc.run)
        for end in range(1, 101):
            log.written.raise_to(end)  # the appends
            nursery.start_soon(put, svc, end, answers)
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert len(answers) == 100 and {status for status, _ in answers.values()} == {OK}
    assert log.flushes <= 2


async def test_group_transfer_statuses(autojump_clock, make_config):
    replicated = Watermark()
    slaves_ok = {"ok": False}
    svc = GroupTransferService.for_replicas(
        replicated, lambda end: slaves_ok["ok"], make_config(slave_timeout=3000)
    )
    answers: dict[int, tuple[PutMessageStatus, float]] = {}
    async with trio.open_nursery() as nursery:
        await nursery.start(svc.run)
        await put(svc, 10, answers)  # no slave close enough: told at once
        assert answers[10] == (PutMessageStatus.SLAVE_NOT_AVAILABLE, 0.0)
        slaves_ok["ok"] = True
        await nursery.start(put, svc, 20, answers)
        await nursery.start(put, svc, 30, answers)
        await trio.sleep(1)
        slaves_ok["ok"] = False  # accepted requests are not judged again
        replicated.raise_to(20)
        await trio.sleep(5)
        nursery.cancel_scope.cancel()
    assert answers[20] == (OK, 1.0)
    assert answers[30] == (PutMessageStatus.FLUSH_SLAVE_TIMEOUT, 3.0)


async def test_a_put_cancelled_while_waiting_for_room_is_answered_and_never_blocks_the_oldest_wait(
        autojump_clock, make_config):
    """Found in issue 11's review: a put cancelled while it waited for room in the full
    channel left its request unsent and unanswered. The group transfer service took it for
    the oldest put still waiting for good, so no slave connection could count again (and
    the master's _count_when_due spun on its past deadline). The request is now answered
    with the timeout status as its put stops waiting."""
    replicated = Watermark()
    svc = GroupTransferService.for_replicas(
        replicated, lambda end: True, make_config(slave_timeout=3000,
                                                  sync_request_channel_capacity=1))
    async with trio.open_nursery() as nursery:
        await nursery.start(svc.run)
        now = trio.current_time()
        # the idle task takes the first, the buffer holds the second, the third must wait
        first, second, third = (svc.request(end, now) for end in (10, 20, 30))
        assert first.sent and second.sent and not third.sent
        with trio.move_on_after(0.5):
            await svc.wait(third)  # the put's caller gives up while it waits for room
        assert third.status is PutMessageStatus.FLUSH_SLAVE_TIMEOUT
        replicated.raise_to(20)
        await trio.sleep(0.1)
        assert first.status is OK and second.status is OK
        assert svc.oldest_waiting() is None  # the cancelled one does not stand in the way
        assert svc.statistics().timed_out == 1
        nursery.cancel_scope.cancel()


async def test_a_put_answered_at_once_is_not_cancellable(autojump_clock, make_config):
    """Found in issue 11's review: a SYNC_MASTER put told SLAVE_NOT_AVAILABLE at once (no
    slave close enough) still reached a cancellation point after its append; a put that
    happened and waits for nothing must return its result."""
    svc = GroupTransferService.for_replicas(Watermark(), lambda end: False, make_config())
    appended = PutMessageResult(OK, 0, 10)
    pending = PendingPut(appended, replica=svc.request(10, trio.current_time()))
    assert pending.done
    result = None
    with trio.CancelScope() as scope:
        scope.cancel()
        result = await pending.wait()
    assert result is not None and result.status is PutMessageStatus.SLAVE_NOT_AVAILABLE
    assert not scope.cancelled_caught


# ---- through a store (worker threads: real time) ---------------------------------------------


async def test_store_puts_wait_in_the_channel_and_statistics_show_them(make_config):
    config = make_config(
        flush_disk_type=FlushDiskType.SYNC_FLUSH, sync_request_channel_capacity=4,
        sync_flush_timeout=30_000,
    )
    async with open_store(config) as store:
        results = []

        async def one(i):
            results.append(await store.put_message(Message("Q", b"x%d" % i)))

        async with trio.open_nursery() as nursery:
            async with store.commitlog._flush_lock:  # a disk that does not sync for now
                for i in range(20):
                    nursery.start_soon(one, i)
                await trio.sleep(0.2)
                stats = group_commit_of(store)
                assert (stats.pending, stats.held, stats.queued, stats.blocked) == (20, 4, 4, 12)
                assert stats.oldest_wait >= 0.15
        assert len(results) == 20 and all(r.ok for r in results)
        assert group_commit_of(store).pending == 0
        await store.wait_dispatched()
        assert store.max_queue_offset("Q", 0) == 20


async def test_the_channel_bound_holds_under_10000_concurrent_store_puts(make_config):
    config = make_config(
        flush_disk_type=FlushDiskType.SYNC_FLUSH, sync_request_channel_capacity=16,
        mapped_file_size_commit_log=4 * 1024 * 1024, sync_flush_timeout=60_000,
    )
    puts = 10_000
    async with open_store(config) as store:
        results = []
        most = {"in_service": 0, "blocked": 0}

        async def one(i):
            results.append(await store.put_message(Message("Many", b"%d" % i), queue_id=i % 4))

        async def watch():
            while len(results) < puts:
                stats = group_commit_of(store)
                most["in_service"] = max(most["in_service"], stats.held + stats.queued)
                most["blocked"] = max(most["blocked"], stats.blocked)
                await trio.lowlevel.checkpoint()

        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch)
                for i in range(puts):
                    nursery.start_soon(one, i)
        assert len(results) == puts and {r.status for r in results} == {OK}
        assert len({r.commitlog_offset for r in results}) == puts
        assert most["in_service"] <= 2 * 16 and most["blocked"] > 0
        stats = group_commit_of(store)
        assert stats.pending == 0 and stats.completed == puts
        await store.wait_dispatched()
        assert sum(store.max_queue_offset("Many", q) for q in range(4)) == puts


async def test_closing_the_store_answers_sync_master_puts_still_waiting(tmp_path):
    config = attrs.evolve(
        _master_config(tmp_path), slave_timeout=60_000, sync_request_channel_capacity=2,
    )
    results = []
    with trio.fail_after(20):
        async with trio.open_nursery() as outside:
            async with open_store(config) as master:
                slave_side, master_side = trio.testing.memory_stream_pair()
                async with trio.open_nursery() as connection:
                    assert master.ha_service is not None
                    connection.start_soon(master.ha_service.handle_stream, master_side)
                    # A slave that reports once, then never acknowledges anything again.
                    await slave_side.send_all(SlaveProtocol().send_report(0))
                    await wait_until(
                        lambda: any(c.acked_offset is not None for c in _connections(master)),
                        "the slave's first report",
                    )

                    async def one(i):
                        results.append(await master.put_message(Message("Close", b"%d" % i)))

                    for i in range(6):
                        outside.start_soon(one, i)
                    await wait_until(lambda: _pending_transfers(master) == 6,
                                     "six puts waiting for slaves")
                    connection.cancel_scope.cancel()
            # The store is closed: every put has its answer, long before slaveTimeout.
            assert [r.status for r in results] == [PutMessageStatus.FLUSH_SLAVE_TIMEOUT] * 6
            assert all(r.status.stored for r in results)


def group_commit_of(store: MessageStore) -> SyncServiceStatistics:
    stats = store.statistics().group_commit
    assert stats is not None  # a SYNC_FLUSH store
    return stats


def _connections(master: MessageStore) -> tuple[SlaveConnectionStatistics, ...]:
    ha = master.statistics().ha
    assert ha is not None
    return ha.connections


def _pending_transfers(master: MessageStore) -> int:
    stats = master.statistics().group_transfer
    assert stats is not None
    return stats.pending


def _master_config(root) -> StoreConfig:
    return StoreConfig(
        store_path_root_dir=str(root), mapped_file_size_commit_log=64 * 1024,
        mapped_file_size_consume_queue=2000, broker_role=BrokerRole.SYNC_MASTER,
        ha_listen_port=0, ha_bind_address="127.0.0.1",
    )
