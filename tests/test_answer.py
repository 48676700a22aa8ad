"""Answer, the one completion type: set once, awaited by a task or received by a callback,
and several awaited together (a put that needs both SYNC_FLUSH and SYNC_MASTER)."""

import pytest
import trio
import trio.testing

from trio_ha.answer import Answer, wait_all, when_all


async def test_the_first_answer_counts_and_wakes_the_waiting_task():
    answer: Answer[str] = Answer()
    got = []

    async def waiter():
        got.append(await answer)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        assert not answer.done and got == []
        assert answer.set("first")
        assert not answer.set("second")  # ignored, and says so
    assert got == ["first"] and answer.value == "first"
    assert await answer.wait() == "first"  # given already: at once


async def test_a_callback_runs_inside_set_or_at_once_when_the_answer_is_given():
    answer: Answer[int] = Answer()
    calls: list[int] = []
    answer.when_done(lambda: calls.append(answer.value))
    assert calls == []
    answer.set(7)
    assert calls == [7]  # in the answering task, before set returned
    answer.set(8)
    assert calls == [7]  # once
    answer.when_done(lambda: calls.append(-answer.value))
    assert calls == [7, -7]


def test_one_listener_of_each_kind():
    answer: Answer[int] = Answer()
    answer.when_done(lambda: None)
    with pytest.raises(RuntimeError):
        answer.when_done(lambda: None)
    with pytest.raises(RuntimeError):
        _ = Answer[int]().value  # no answer yet


async def test_a_cancelled_waiter_stops_listening_and_the_answer_is_still_given():
    answer: Answer[int] = Answer()
    with trio.move_on_after(0.01) as scope:
        await answer
    assert scope.cancelled_caught
    assert answer.set(1) and answer.value == 1
    later: Answer[int] = Answer()

    async def waiter():
        assert await later == 2

    async with trio.open_nursery() as nursery:  # the slot is free for another waiter
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        later.set(2)


async def test_two_tasks_may_not_wait_for_one_answer():
    answer: Answer[int] = Answer()
    got = []

    async def waiter():
        got.append(await answer)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(RuntimeError):
            await answer.wait()
        answer.set(1)
    assert got == [1]  # the first waiter still had its wait


def test_when_all_calls_back_once_after_the_last_answer():
    first: Answer[int] = Answer()
    second: Answer[int] = Answer()
    calls: list[str] = []
    when_all((first, None, second), lambda: calls.append("both"))
    first.set(1)
    assert calls == []
    second.set(2)
    assert calls == ["both"]
    first.set(3)
    second.set(4)
    assert calls == ["both"]
    when_all((first, second), lambda: calls.append("given already"))
    assert calls == ["both", "given already"]
    when_all((None, None), lambda: calls.append("nothing to wait for"))
    assert calls[-1] == "nothing to wait for"


def test_when_all_with_one_answer_left_registers_the_callback_itself():
    given: Answer[int] = Answer()
    given.set(1)
    left: Answer[int] = Answer()
    calls: list[int] = []

    def callback() -> None:
        calls.append(left.value)

    when_all((given, left), callback)
    assert left._callback is callback  # no wrapper made for a single wait
    left.set(5)
    assert calls == [5]


async def test_wait_all_returns_once_every_answer_is_given():
    first: Answer[int] = Answer()
    second: Answer[int] = Answer()
    done = trio.Event()

    async def waiter():
        await wait_all((first, None, second))
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        second.set(2)
        await trio.testing.wait_all_tasks_blocked()
        assert not done.is_set()
        first.set(1)
    assert done.is_set()
