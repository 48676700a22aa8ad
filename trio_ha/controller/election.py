"""Who becomes master: the election policy, as a pure function of the set and the heartbeats.

RocketMQ 5's rule (``DefaultElectPolicy``), which we keep:

1. The pool is the in-sync members that are alive. A member outside the in-sync set may lack
   acknowledged messages; a dead one cannot serve.
2. If the old master is in the pool (and the admin named nobody else), it stays: the answer is
   MASTER_STILL_EXIST, and nothing changes.
3. An admin's ``designateElect`` names the one broker to elect; it wins only if it is in the
   pool, otherwise nobody does.
4. Otherwise the best of the pool wins: the highest last epoch, then the highest log end
   (maxOffset), then the lowest election priority number, all as last heard in heartbeats.
5. Only if that finds nobody, and unclean elections are enabled, the same steps run over every
   alive member, in sync or not (such a master may lack acknowledged messages).

Two differences, both deliberate (docs/differences.md):

- RocketMQ compares offsets as ``(int)(b.maxOffset - a.maxOffset)``: for logs more than 2 GiB
  apart the int wraps and the broker with *less* data can win. We compare the numbers.
  (Its priority comparison subtracts ints too; ours compares them.)
- RocketMQ sorts into a TreeSet, which keeps one of several equally ranked brokers, whichever
  came first from a hash set. We break the tie by the lowest broker id, so the same inputs
  always elect the same broker.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import attrs

from .liveness import LiveInfo

__all__ = ["ElectionOutcome", "elect", "rank_key"]


@attrs.frozen
class ElectionOutcome:
    """The policy's answer: ``master`` None means nobody is eligible; ``kept`` means the old
    master stays; ``unclean`` means the winner was not in the in-sync set."""

    master: int | None
    kept: bool = False
    unclean: bool = False


def rank_key(broker_id: int, info: LiveInfo) -> tuple[int, int, int, int]:
    """Sort key, best first: epoch descending, maxOffset descending, priority ascending, then
    the broker id ascending. Python's integers do not wrap, so any two offsets compare right."""
    return (-info.epoch, -info.max_offset, info.election_priority, broker_id)


def _try(
    candidates: Iterable[int],
    old_master: int | None,
    designated: int | None,
    live_info: Callable[[int], LiveInfo | None],
) -> ElectionOutcome | None:
    pool = {i: info for i in candidates if (info := live_info(i)) is not None}
    if not pool:
        return None
    if old_master in pool and designated in (None, old_master):
        return ElectionOutcome(old_master, kept=True)
    if designated is not None:
        return ElectionOutcome(designated) if designated in pool else None
    return ElectionOutcome(min(pool, key=lambda i: rank_key(i, pool[i])))


def elect(
    *,
    sync_state_set: Iterable[int],
    all_members: Iterable[int] | None,
    old_master: int | None,
    designated: int | None,
    live_info: Callable[[int], LiveInfo | None],
) -> ElectionOutcome:
    """Elect among ``sync_state_set``, then (when ``all_members`` is given: unclean elections
    enabled) among all members. ``live_info(id)`` is the member's last heartbeat if it is alive
    now, else None."""
    outcome = _try(sync_state_set, old_master, designated, live_info)
    if outcome is not None:
        return outcome
    if all_members is not None:
        outcome = _try(all_members, old_master, designated, live_info)
        if outcome is not None:
            return attrs.evolve(outcome, unclean=not outcome.kept)
    return ElectionOutcome(None)
