"""The checker's rules for controller mode: what a failover may not do, and what it cost.

In controller mode the master moves: a controller elects a new one from the in-sync set,
epochs fence the old one, and a broker that rejoins cuts its log back to the point it shares
with the new master. The classic checks (every acknowledged send on the master, slaves a
prefix of it) still hold, with "the master" being the one the controller named last (the
*final master*). These rules add what only a moving master can break, each a pure function
of the history and the final master's store, so each is tested on a hand-made history that
breaks it:

- **order**: a producer sends one message at a time, so its acknowledged sends must sit in
  the final log in the order they were acknowledged (a failover that lost an acknowledged
  send and then took later ones would break it, and so would a log spliced from two
  masters);
- **fencing**: a SEND_OK carries the message's place (the offsetMsgId packs the acking
  broker's address and the commitlog offset). The final master's log must hold that very
  message there. Another message at that offset, or the message only somewhere else, means
  the ack came from a log the set did not keep: a master whose epoch had ended (fenced)
  acknowledged, or a failover elected a replica that lacked the acknowledged bytes;
- **consumed, then replaced**: every message a consumer was handed must still be in the
  final master's log at the queue offset (and commitlog offset) it was read at. Consumers
  read only what every in-sync replica confirmed, so nothing they saw may be cut back;
- **outages**: for each fault that removes the master (SIGKILL, SIGSTOP, isolation): the time
  to the first SEND_OK from another broker (or from the same one once it is back), and the
  time until the controller named another master. Reported, never asserted: they are the
  targets the issue asks to print. A failover is a change of the master epoch.
"""

from __future__ import annotations

import collections
import statistics
from collections.abc import Iterable, Mapping
from typing import Protocol

import attrs

from ..wire.errors import WireError
from ..wire.record import decode_message_id
from .history import FaultEvent, History, MasterEvent, SendEvent


class StoreContents(Protocol):
    """What the rules read of the final master's store (``checker.StoreContents``)."""

    @property
    def max_offset(self) -> int: ...

    @property
    def queues(self) -> Mapping[int, list[tuple[int, str]]]: ...

    @property
    def records(self) -> Mapping[int, str]: ...

__all__ = ["MASTER_FAULTS", "Outage", "acked_place", "consumed_replaced", "epoch_changes",
           "fencing_violations", "final_master", "master_changes", "order_violations",
           "outage_figures",
           "outages"]

#: the fault kinds that take the master away (its process, its time or its network)
MASTER_FAULTS = ("kill-master", "pause-master", "isolate-master")


def acked_place(send: SendEvent) -> tuple[str, int] | None:
    """Where the broker said it stored ``send``: (its address, the commitlog offset); None
    without a readable offsetMsgId."""
    if not send.offset_msg_id:
        return None
    try:
        return decode_message_id(send.offset_msg_id.split(",", 1)[0])
    except WireError:
        return None


def _acked(history: History) -> list[SendEvent]:
    return [s for s in history.sends if s.status == "SEND_OK"]


def _places(records: Mapping[int, str]) -> dict[str, list[int]]:
    """Send id -> the commitlog offsets holding it, lowest first."""
    found: dict[str, list[int]] = collections.defaultdict(list)
    for offset in sorted(records):
        found[records[offset]].append(offset)
    return found


def order_violations(history: History, master: StoreContents) -> list[str]:
    """Per producer, acknowledged sends the final log holds out of their acknowledgement
    order. A send's place is its acked offset where the log holds it there, else its first
    place in the log (a retry that stored twice: every attempt of one send comes before any
    of the next); sends the log lacks are the loss check's."""
    places = _places(master.records)
    problems = []
    by_producer: dict[int, list[SendEvent]] = collections.defaultdict(list)
    for send in _acked(history):
        by_producer[send.producer].append(send)
    for producer, sends in sorted(by_producer.items()):
        last: tuple[int, str] | None = None
        for send in sorted(sends, key=lambda s: s.ended):
            held = places.get(send.id)
            if not held:
                continue
            acked = acked_place(send)
            offset = acked[1] if acked and acked[1] in held else held[0]
            if last is not None and offset <= last[0]:
                problems.append(f"producer {producer}: {send.id} (acked after {last[1]}) at "
                                f"{offset}, before {last[1]} at {last[0]}")
            last = (offset, send.id)
    return problems


def fencing_violations(history: History, master: StoreContents) -> list[str]:
    """Acknowledged sends the final log does not hold where their ack said: another message
    (or no record) at that offset, or the message only elsewhere. A send the log lacks
    altogether, acked past the log's end, is a loss (the loss check's), not counted here."""
    places = _places(master.records)
    problems = []
    for send in _acked(history):
        acked = acked_place(send)
        if acked is None:
            continue
        address, offset = acked
        there = master.records.get(offset)
        if there == send.id:
            continue
        if there is not None:
            problems.append(f"{send.id} acked by {address} at {offset}, which holds {there}")
        elif offset < master.max_offset:
            problems.append(f"{send.id} acked by {address} at {offset}, where no record of "
                            f"the topic starts")
        elif send.id in places:
            problems.append(f"{send.id} acked by {address} at {offset} (past the final log's "
                            f"end), held only at {places[send.id][0]}")
    return problems


def consumed_replaced(history: History, master: StoreContents) -> list[str]:
    """Messages a consumer was handed that the final master's log does not hold where they
    were read: another message at that queue offset or commitlog offset, or none."""
    queues = {queue: dict(entries) for queue, entries in master.queues.items()}
    problems = []
    for c in history.consumed:
        at_queue = queues.get(c.queue_id, {}).get(c.queue_offset)
        at_log = master.records.get(c.commitlog_offset)
        if at_queue == c.id and at_log == c.id:
            continue
        now = (f"now {at_queue}" if at_queue is not None and at_queue != c.id
               else f"now {at_log} at commitlog {c.commitlog_offset}"
               if at_log is not None and at_log != c.id else "gone from the final log")
        problems.append(f"{c.id} read at queue {c.queue_id} offset {c.queue_offset}: {now}")
    return problems


def final_master(history: History) -> MasterEvent | None:
    """The last master the controller named (None: it never named one)."""
    named = [m for m in history.masters if m.master is not None]
    return named[-1] if named else None


def epoch_changes(masters: Iterable[MasterEvent]) -> int:
    """How many times the master epoch rose after the first master was seen: elections the
    watcher saw, counted by the epoch's rise (two between two looks count two)."""
    epochs = [m.epoch for m in masters if m.master is not None]
    return sum(max(0, b - a) for a, b in zip(epochs, epochs[1:], strict=False))


def master_changes(masters: Iterable[MasterEvent]) -> int:
    """How many times the controller named a different broker master than the last one
    it named (an election of no one, or of the same broker again, raises the epoch but
    moves nothing)."""
    named = [m.master for m in masters if m.master is not None]
    return sum(a != b for a, b in zip(named, named[1:], strict=False))


@attrs.frozen
class Outage:
    """One fault that took the master away, and what it cost."""

    fault: FaultEvent
    #: seconds from the fault to the first SEND_OK from another broker (or from the same one
    #: after the fault ended); None: none before the run ended
    writes_back: float | None
    #: seconds from the fault to the controller naming another master; None: it did not
    #: (a pause or an isolation shorter than the heartbeat timeout)
    new_master: float | None


def outages(history: History) -> list[Outage]:
    """Each master fault (one that landed on a named broker) with its outage. What comes
    after the next master fault began is that one's: a fault whose writes did not come back
    (or whose master was not replaced) before the next says None."""
    acks = sorted((s.ended, place[0]) for s in _acked(history)
                  if (place := acked_place(s)) is not None)
    faults = sorted((f for f in history.faults if f.kind in MASTER_FAULTS and f.address
                     and not f.failed), key=lambda f: f.started)
    found = []
    for n, fault in enumerate(faults):
        until = faults[n + 1].started if n + 1 < len(faults) else float("inf")
        back = next((ended - fault.started for ended, address in acks
                     if fault.started < ended < until
                     and (address != fault.address or ended >= fault.ended)), None)
        elected = next((m.at - fault.started for m in history.masters
                        if fault.started < m.at < until and m.master is not None
                        and m.master != fault.node), None)
        found.append(Outage(fault, None if back is None else round(back, 3),
                            None if elected is None else round(elected, 3)))
    return found


def _spread(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {"median": round(statistics.median(values), 3), "max": round(max(values), 3)}


def outage_figures(history: History) -> dict[str, dict[str, float | int]]:
    """Per master fault kind (and ``all``): how many, the write outage's median and max,
    how many saw another master named, and the time to it (median, max)."""
    by_kind: dict[str, list[Outage]] = collections.defaultdict(list)
    for outage in outages(history):
        by_kind[outage.fault.kind].append(outage)
        by_kind["all"].append(outage)
    report: dict[str, dict[str, float | int]] = {}
    for kind, found in by_kind.items():
        back = [o.writes_back for o in found if o.writes_back is not None]
        elected = [o.new_master for o in found if o.new_master is not None]
        row: dict[str, float | int] = {"faults": len(found), "new master": len(elected)}
        row.update({f"writes back {k} s": v for k, v in _spread(back).items()})
        row.update({f"new master {k} s": v for k, v in _spread(elected).items()})
        if len(back) < len(found):
            row["no write after it"] = len(found) - len(back)
        report[kind] = row
    return report
