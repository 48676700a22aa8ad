"""The election policy alone: the pool, the order, the old master, designation, unclean."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from trio_ha.controller.election import ElectionOutcome, elect, rank_key
from trio_ha.controller.liveness import LiveInfo

GIB = 1024**3


def info(epoch: int = 1, max_offset: int = 0, priority: int = 2**31 - 1) -> LiveInfo:
    return LiveInfo("a:1", "a:1", 0.0, 10_000, epoch, max_offset, 0, priority)


def run(alive: dict[int, LiveInfo], sync: set[int], *, members: set[int] | None = None,
        old: int | None = None, designated: int | None = None) -> ElectionOutcome:
    return elect(sync_state_set=sync, all_members=members, old_master=old,
                 designated=designated, live_info=alive.get)


def test_order_is_epoch_then_offset_then_lower_priority_then_lower_id() -> None:
    assert run({1: info(2, 0), 2: info(3, 0)}, {1, 2}).master == 2
    assert run({1: info(3, 100), 2: info(3, 200)}, {1, 2}).master == 2
    assert run({1: info(3, 200, 5), 2: info(3, 200, 4)}, {1, 2}).master == 2
    assert run({1: info(3, 200, 4), 2: info(3, 200, 4)}, {1, 2}).master == 1
    assert run({3: info(3, 200, 4), 2: info(3, 200, 4)}, {2, 3}).master == 2


def _java_int(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - 2**32 if value >= 2**31 else value


def test_offsets_more_than_2_gib_apart_compare_right() -> None:
    # RocketMQ's comparator returns (int)(o2.maxOffset - o1.maxOffset): for these two the cast
    # makes the broker with 3 GiB less data sort first.
    behind, ahead = info(1, 1 * GIB), info(1, 4 * GIB)
    assert _java_int(ahead.max_offset - behind.max_offset) < 0  # the Java comparator's error
    assert run({1: behind, 2: ahead}, {1, 2}).master == 2
    assert run({1: ahead, 2: behind}, {1, 2}).master == 1
    assert run({1: info(1, 2**62), 2: info(1, 0)}, {1, 2}).master == 1


def test_priority_extremes_compare_right() -> None:
    # Java's o1.priority - o2.priority overflows for these two as well
    low, high = info(1, 0, -(2**31)), info(1, 0, 2**31 - 1)
    assert run({1: high, 2: low}, {1, 2}).master == 2


def test_the_pool_is_the_alive_in_sync_members() -> None:
    assert run({3: info(9, 9)}, {1, 2}) == ElectionOutcome(None)  # 3 not in sync
    assert run({}, {1, 2}) == ElectionOutcome(None)  # nobody alive
    assert run({1: info(), 3: info(9, 9)}, {1, 2}).master == 1


def test_an_alive_old_master_is_kept() -> None:
    assert run({1: info(1, 0), 2: info(5, 99)}, {1, 2}, old=1) == ElectionOutcome(1, kept=True)


def test_designation_picks_only_a_pool_member() -> None:
    alive = {1: info(), 2: info(), 3: info()}
    assert run(alive, {1, 2}, old=1, designated=2) == ElectionOutcome(2)
    assert run(alive, {1, 2}, old=1, designated=1) == ElectionOutcome(1, kept=True)
    assert run(alive, {1, 2}, old=1, designated=3) == ElectionOutcome(None)


def test_unclean_only_when_the_in_sync_pool_is_empty_and_enabled() -> None:
    alive = {3: info(), 4: info(2, 5)}
    assert run(alive, {1, 2}).master is None
    assert run(alive, {1, 2}, members={1, 2, 3, 4}) == ElectionOutcome(4, unclean=True)
    assert run({1: info(), 4: info(9, 9)}, {1, 2}, members={1, 2, 4}) == ElectionOutcome(1)
    assert run(alive, {1, 2}, members={1, 2, 3, 4}, designated=3) == \
        ElectionOutcome(3, unclean=True)


@given(st.dictionaries(st.integers(1, 8), st.tuples(
    st.integers(-1, 10), st.integers(-1, 2**63 - 1), st.integers(-(2**31), 2**31 - 1)),
    min_size=1))
def test_the_winner_ranks_no_lower_than_any_pool_member(
        pool: dict[int, tuple[int, int, int]]) -> None:
    alive = {i: info(*v) for i, v in pool.items()}
    winner = run(alive, set(pool)).master
    assert winner is not None
    best = rank_key(winner, alive[winner])
    for i, live in alive.items():
        e, o, p = pool[i]
        w = pool[winner]
        assert (w[0], w[1]) >= (e, o)  # never a lower epoch, nor a lower offset at one epoch
        assert best <= rank_key(i, live)
