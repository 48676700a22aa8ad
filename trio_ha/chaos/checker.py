"""The verdict of a chaos run: the history checked against the store files left behind.

The stores are read after every node was SIGKILLed at once and each store recovered on its
own (opened in this process, as the next start of its broker would), so what counts is what
a crash leaves, not what a clean stop would have flushed. The checks:

1. every acknowledged send (SEND_OK) is in the master's consume queues;
2. with SYNC_MASTER, in as many slaves' as its SEND_OK waited for (haSyncAcks); what each
   slave lacks is reported (an ASYNC_MASTER promises no slave anything: reported only);
3. every consumed message was sent (its id is one a producer tried);
4. per queue, the offsets consumed have no gaps, and an offset always held the same message
   (the master and a slave never disagreed about a queue);
5. every slave's commitlog is a byte prefix of its master's;
6. every send ended within its timeout (the producer's sendMsgTimeout, plus a second of
   slack for the scheduling of a loaded machine);
7. every fault that began was made and undone: a harness that failed to break something has
   not shown that the cluster survives it, and a node that would not start again after a
   kill is a failure of the node.

Duplicates (the same id stored or consumed twice) are counted: they are at-least-once at
work (a retry after a timeout the broker had already stored), not failures.

In controller mode "the master" is the final master (the one the controller named last),
check 2 gives way to what a moving master must keep (``failover``: acknowledged sends in each
producer's order, no ack from a fenced master, no consumed message replaced), and the figures
add the failovers and the write outage each master fault caused.
"""

from __future__ import annotations

import bisect
import collections
from pathlib import Path
from typing import Any

import attrs
import trio

from ..config import StoreConfig
from ..store import open_store
from . import failover
from .history import FaultEvent, History, body_id
from .plan import ChaosConfig

__all__ = ["Check", "StoreContents", "Verdict", "check", "read_store"]

#: how late a send may end past its timeout before it counts as a violation
TIMEOUT_SLACK = 1.0
#: bytes compared at a time when checking a slave's log is a prefix of its master's
_CHUNK = 1 << 20


@attrs.frozen
class StoreContents:
    """What a store holds of the chaos topic after recovery."""

    path: str
    max_offset: int
    #: queue id -> [(queue offset, send id)], in offset order
    queues: dict[int, list[tuple[int, str]]]
    #: commitlog offset -> send id, for every message of the topic
    records: dict[int, str] = attrs.field(factory=dict)

    @property
    def ids(self) -> collections.Counter[str]:
        return collections.Counter(send_id for entries in self.queues.values()
                                   for _, send_id in entries)


async def read_store(conf: Path, config: ChaosConfig) -> StoreContents:
    """Open (recover) the store of the broker whose conf file is ``conf`` as that broker
    would (its role, sizes and directory), and list the chaos topic's queues."""
    # (no HA port nor master: this is a reading, not a node)
    store_config = StoreConfig.from_properties(await trio.Path(conf).read_text(),
                                               ha_listen_port=None, ha_master_address=None)
    # (a controller-mode store would build its queues only up to a confirm offset its
    # master sends; the checker reads the whole recovered log, which is what is there)
    store_config = attrs.evolve(store_config, enable_controller_mode=False)
    store_dir = Path(store_config.store_path_root_dir)
    queues: dict[int, list[tuple[int, str]]] = {}
    records: dict[int, str] = {}
    async with open_store(store_config) as store:
        await store.wait_dispatched()
        for queue_id in range(config.queues):
            entries: list[tuple[int, str]] = []
            offset = max(0, store.min_queue_offset(config.topic, queue_id))
            end = store.max_queue_offset(config.topic, queue_id)
            while offset < end:
                messages = await store.get_messages(config.topic, queue_id, offset, 64)
                if not messages:
                    break
                entries.extend((m.queue_offset, body_id(m.body)) for m in messages)
                records.update((m.commitlog_offset, body_id(m.body)) for m in messages)
                offset = messages[-1].queue_offset + 1
            queues[queue_id] = entries
        max_offset = store.max_commitlog_offset
    return StoreContents(str(store_dir), max_offset, queues, records)


def log_prefix_problem(master: StoreContents, slave: StoreContents) -> str | None:
    """Where the slave's commitlog stops being a byte prefix of the master's, or None."""
    if slave.max_offset > master.max_offset:
        return f"the slave's log ends at {slave.max_offset}, past the master's {master.max_offset}"
    master_files = {p.name: p for p in (Path(master.path) / "commitlog").iterdir()}
    for slave_file in sorted((Path(slave.path) / "commitlog").iterdir()):
        if not slave_file.name.isdigit():
            continue
        base = int(slave_file.name)
        if base >= slave.max_offset:
            continue
        master_file = master_files.get(slave_file.name)
        if master_file is None:
            return f"the slave has segment {slave_file.name}, the master does not"
        length = min(slave_file.stat().st_size, slave.max_offset - base)
        with slave_file.open("rb") as ours, master_file.open("rb") as theirs:
            done = 0
            while done < length:
                size = min(_CHUNK, length - done)
                a, b = ours.read(size), theirs.read(size)
                if a != b:
                    at = next(i for i in range(min(len(a), len(b))) if a[i] != b[i]) \
                        if len(a) == len(b) else min(len(a), len(b))
                    return f"the logs differ at commitlog offset {base + done + at}"
                done += size
    return None


@attrs.frozen
class Check:
    name: str
    passed: bool
    detail: str


@attrs.frozen
class Verdict:
    config: ChaosConfig
    checks: tuple[Check, ...]
    figures: dict[str, Any]

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def as_dict(self) -> dict[str, Any]:
        return {
            "config": self.config.as_dict(),
            "passed": self.passed,
            "checks": [attrs.asdict(c) for c in self.checks],
            "figures": self.figures,
        }

    def report(self) -> str:
        lines = [f"chaos run {self.config.describe()}"]
        for key, value in self.figures.items():
            if isinstance(value, dict) and value and all(isinstance(v, dict)
                                                         for v in value.values()):
                lines.append(f"  {key}:")
                lines.extend(f"    {name}: " + ", ".join(f"{k} {v}" for k, v in row.items())
                             for name, row in value.items())
            else:
                lines.append(f"  {key}: {value}")
        for c in self.checks:
            lines.append(f"  [{'pass' if c.passed else 'FAIL'}] {c.name}: {c.detail}")
        failed = sum(not c.passed for c in self.checks)
        lines.append(f"{len(self.checks) - failed} passed, {failed} failed "
                     f"(replay: trio-ha chaos run --replay <run directory>; seed "
                     f"{self.config.seed})")
        return "\n".join(lines)


def _sample(items: list[str], limit: int = 5) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def longest_unavailability(history: History) -> float:
    """The longest time between two successful sends (or from the first send to the first
    success), in seconds: how long producers could not get a message acknowledged."""
    acked = sorted(s.ended for s in history.sends if s.status == "SEND_OK")
    if not history.sends:
        return 0.0
    start = min(s.started for s in history.sends)
    marks = [start, *acked, max(s.ended for s in history.sends)]
    return round(max(b - a for a, b in zip(marks, marks[1:], strict=False)), 3)


def recoveries(history: History) -> list[tuple[FaultEvent, float]]:
    """Each fault the cluster was left alone to get over, with the time from its end to the
    next acknowledged send: how long it took to take writes again. Left alone means no other
    fault was in force between the two (with overlapping faults, many never are)."""
    acked = sorted(s.ended for s in history.sends if s.status == "SEND_OK")
    faults = sorted(history.faults, key=lambda f: f.started)
    found = []
    for fault in faults:
        at = bisect.bisect_left(acked, fault.ended)
        if at == len(acked):
            continue
        others = (f for f in faults if f is not fault and f.started <= acked[at]
                  and f.ended >= fault.ended)
        if next(others, None) is None:
            found.append((fault, acked[at] - fault.ended))
    return found


def longest_recovery(history: History) -> float | None:
    """The longest of :func:`recoveries` (None: no fault was left alone)."""
    waits = [wait for _, wait in recoveries(history)]
    return round(max(waits), 3) if waits else None


def recovery_by_kind(history: History) -> dict[str, dict[str, float | int]]:
    """Per fault kind: how many were injected, how many the cluster was left alone to get
    over, and the longest and median time it took to take writes again after them."""
    waits: dict[str, list[float]] = collections.defaultdict(list)
    for fault, wait in recoveries(history):
        waits[fault.kind].append(wait)
    counts = collections.Counter(f.kind for f in history.faults)
    report: dict[str, dict[str, float | int]] = {}
    for kind, count in counts.most_common():
        mine = sorted(waits.get(kind, []))
        report[kind] = {"injected": count, "left alone": len(mine)}
        if mine:
            report[kind].update({"longest recovery s": round(mine[-1], 3),
                                 "median recovery s": round(mine[len(mine) // 2], 3)})
    return report


def check(config: ChaosConfig, history: History, master: StoreContents,
          slaves: list[StoreContents]) -> Verdict:
    """The verdict of a run (see the module's docstring)."""
    checks = []
    acked = [s.id for s in history.sends if s.status == "SEND_OK"]
    attempted = {s.id for s in history.sends}
    on_master = master.ids
    missing = [i for i in acked if i not in on_master]
    checks.append(Check("acknowledged sends on the master", not missing,
                        f"{len(acked) - len(missing)} of {len(acked)}"
                        + (f"; missing {_sample(missing)}" if missing else "")))
    lag = {}
    holders: collections.Counter[str] = collections.Counter()
    for n, slave in enumerate(slaves, 1):
        on_slave = slave.ids
        holders.update(i for i in set(acked) if i in on_slave)
        lag[f"slave{n}"] = sum(i not in on_slave for i in acked)
        problem = log_prefix_problem(master, slave)
        checks.append(Check(f"slave {n}'s commitlog is a prefix of the master's",
                            problem is None,
                            problem or f"{slave.max_offset} of {master.max_offset} bytes"))
    if config.strict:
        # (a SEND_OK waited for sync_acks slaves: so many hold it, whichever they are)
        short = [i for i in acked if holders[i] < config.sync_acks]
        checks.append(Check(f"acknowledged sends on {config.sync_acks} slave(s)", not short,
                            f"{len(acked) - len(short)} of {len(acked)}"
                            + (f"; short of it: {_sample(short)}" if short else "")))
    unknown = sorted({c.id for c in history.consumed} - attempted)
    checks.append(Check("every consumed message was sent", not unknown,
                        f"{len(history.consumed)} consumed"
                        + (f"; never sent: {_sample(unknown)}" if unknown else "")))
    by_queue: dict[int, dict[int, set[str]]] = collections.defaultdict(
        lambda: collections.defaultdict(set))
    for c in history.consumed:
        by_queue[c.queue_id][c.queue_offset].add(c.id)
    gaps, conflicts = [], []
    for queue_id, offsets in sorted(by_queue.items()):
        seen = sorted(offsets)
        if seen and len(seen) != seen[-1] - seen[0] + 1:
            holes = sorted(set(range(seen[0], seen[-1] + 1)) - set(seen))
            gaps.append(f"queue {queue_id}: {_sample([str(h) for h in holes], 3)}")
        conflicts.extend(f"queue {queue_id} offset {o}: {sorted(ids)}"
                         for o, ids in offsets.items() if len(ids) > 1)
    checks.append(Check("consumed offsets have no gaps", not gaps,
                        "; ".join(gaps) if gaps else f"{len(by_queue)} queues"))
    checks.append(Check("an offset always held the same message", not conflicts,
                        _sample(conflicts, 3) if conflicts else "yes"))
    bound = config.send_timeout + TIMEOUT_SLACK
    late = [f"{s.id} took {s.ended - s.started:.2f} s" for s in history.sends
            if s.ended - s.started > bound]
    checks.append(Check(f"every send ended within {bound:g} s", not late,
                        _sample(late, 3) if late else f"{len(history.sends)} sends"))
    if config.controller is not None:
        checks.extend(_controller_checks(history, master))
    botched = [f"{f.kind} at {f.started:.1f} s: {f.detail}" for f in history.faults
               if f.failed]
    checks.append(Check("every fault was injected and undone", not botched,
                        _sample(botched, 2) if botched else f"{len(history.faults)} faults"))
    statuses = collections.Counter(s.status or (s.error or "error").split(":", 1)[0]
                                   for s in history.sends)
    consumed_ids = collections.Counter(c.id for c in history.consumed)
    fenced = (len(failover.fencing_violations(history, master))
              if config.controller is not None else None)
    figures: dict[str, Any] = {
        "sends": len(history.sends),
        "acknowledged": len(acked),
        "outcomes": dict(statuses.most_common()),
        "lost acknowledged (master)": len(missing),
        **({"fencing violations": fenced} if fenced is not None else {}),
        "acknowledged missing on slaves": lag,
        "stored twice (retries)": sum(n - 1 for n in on_master.values() if n > 1),
        "consumed": len(history.consumed),
        "consumed twice": sum(n - 1 for n in consumed_ids.values() if n > 1),
        "faults": dict(collections.Counter(f.kind for f in history.faults).most_common()),
        "longest unavailability s": longest_unavailability(history),
        "longest recovery after a fault s": longest_recovery(history),
        "by kind": recovery_by_kind(history),
    }
    if config.controller is not None:
        named = failover.final_master(history)
        figures["final master"] = (f"{named.master} (epoch {named.epoch})" if named
                                   else None)
        figures["failovers (master epoch changes)"] = failover.epoch_changes(history.masters)
        figures["master changes (another broker named)"] = failover.master_changes(
            history.masters)
        figures["master faults: write outage and new master"] = failover.outage_figures(
            history)
    return Verdict(config, tuple(checks), figures)


def _controller_checks(history: History, master: StoreContents) -> list[Check]:
    """What a moving master must keep (see ``failover``)."""
    checks = [Check("the controller named a master at the end",
                    failover.final_master(history) is not None,
                    f"{len(history.masters)} views of the set recorded")]
    for name, problems, fine in (
            ("acknowledged sends in each producer's order",
             failover.order_violations(history, master), "in order"),
            ("no acknowledgement from a fenced master (each at its acked offset)",
             failover.fencing_violations(history, master), "every ack where it said"),
            ("no consumed message later replaced",
             failover.consumed_replaced(history, master),
             f"{len(history.consumed)} consumed, each still where it was read")):
        checks.append(Check(name, not problems,
                            f"{len(problems)}: {_sample(problems, 3)}" if problems else fine))
    return checks
