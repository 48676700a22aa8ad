"""The Watermark primitive: prefix wake-ups, cancellation, bounded garbage."""

import trio
import trio.testing

from trio_ha import Watermark


async def test_rise_wakes_exactly_the_satisfied_prefix():
    mark = Watermark()
    woken = []

    async def wait(target):
        await mark.wait_for(target)
        woken.append(target)

    async with trio.open_nursery() as nursery:
        for target in (5, 1, 3, 9):
            nursery.start_soon(wait, target)
        await trio.testing.wait_all_tasks_blocked()
        mark.raise_to(4)
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(woken) == [1, 3]
        mark.raise_to(2)  # lower: ignored
        assert mark.value == 4
        mark.raise_to(9)
    assert sorted(woken) == [1, 3, 5, 9]


async def test_already_reached_returns_after_a_checkpoint():
    mark = Watermark(10)
    with trio.testing.assert_checkpoints():
        assert await mark.wait_for(3) == 10


async def test_cancelled_waiters_leave_and_garbage_stays_bounded(autojump_clock):
    mark = Watermark()
    for _ in range(1000):  # a long poll timing out again and again on an idle queue
        with trio.move_on_after(1):
            await mark.wait_for(1)
    assert mark.statistics().waiters == 0
    assert len(mark._waiters) <= 130  # compacted, not 1000 dead entries
    async with trio.open_nursery() as nursery:
        nursery.start_soon(mark.wait_for, 1)
        await trio.testing.wait_all_tasks_blocked()
        assert mark.statistics().waiters == 1
        mark.raise_to(1)


async def test_reset_lowers_without_waking_and_raises_with():
    mark = Watermark(100)
    mark.reset(50)
    assert mark.value == 50
    async with trio.open_nursery() as nursery:
        nursery.start_soon(mark.wait_for, 60)
        await trio.testing.wait_all_tasks_blocked()
        mark.reset(70)


async def test_rewind_lowers_and_wakes_every_waiter_to_look_again():
    """A live truncation (trio_ha.store.truncation) lowers the log's marks: a waiter for an
    offset past the cut would otherwise sleep until the log grows past its old end."""
    mark = Watermark(100)
    seen: list[int] = []

    async def wait(target: int) -> None:
        seen.append(await mark.wait_for(target))

    async with trio.open_nursery() as nursery:
        for target in (101, 150, 300):
            nursery.start_soon(wait, target)
        await trio.testing.wait_all_tasks_blocked()
        mark.rewind(40)
    assert mark.value == 40
    assert seen == [40, 40, 40]  # each sees the lower value and decides again
    mark.rewind(60)  # not lower: a plain rise
    assert mark.value == 60


async def test_listeners_hear_every_rise_synchronously_and_can_leave():
    mark = Watermark()
    heard: list[int] = []
    mark.add_listener(heard.append)
    mark.raise_to(5)
    mark.raise_to(3)  # not a rise
    mark.reset(1)  # a fall: not a rise either
    mark.reset(8)
    assert heard == [5, 8]  # already, with no checkpoint in between
    mark.remove_listener(heard.append)
    mark.raise_to(9)
    assert heard == [5, 8]
