"""The verdict of a ``trio-ha chaos hostile`` run: what each node, store and the good client
came to, whether the run passed, and the report an operator reads (``human``) or a program
does (``as_json``).

The run passes when every node stayed up and stopped cleanly, the good client kept working
(every send answered with a stored status, nothing acknowledged lost, no long stall) and
every store verifies clean. The report says what each attack sent and how the node
answered; what failed is named one line each.

Why apart from the run (``hostile_run``): these are frozen values and the rules that judge
them, with no process, socket or trio in them; the run fills them in once, at its end, and
the verdict's rules are tested on values made by hand, without a cluster.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import attrs

from ..client import SendStatus
from . import hostile
from .fuzz import FuzzOutcome

__all__ = ["GoodClientOutcome", "HostileReport", "NodeVerdict", "StoreVerdict"]


@attrs.frozen
class NodeVerdict:
    name: str
    pid: int
    #: still running when the attacks ended
    stayed_up: bool
    #: its exit status after the graceful stop (0: stopped cleanly; -9: killed after it hung)
    exit_status: int | None
    #: the size of its log after the run: a node that logs every hostile peer at length
    #: lets the attacker fill its disk (a well-behaved one rate-limits those lines)
    log_bytes: int = 0
    log_tail: str | None = None

    @property
    def ok(self) -> bool:
        return self.stayed_up and self.exit_status == 0


@attrs.frozen
class StoreVerdict:
    name: str
    path: str
    clean: bool
    records: int = 0
    log_end: int = 0
    damage: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()



@attrs.frozen
class GoodClientOutcome:
    """What a well-behaved producer and consumer saw while the cluster was attacked."""

    #: answered sends by status (all stored), and failed sends by error
    sends: Mapping[str, int] = attrs.field(factory=dict, converter=hostile.sorted_counts)
    send_failures: Mapping[str, int] = attrs.field(factory=dict, converter=hostile.sorted_counts)
    pulls: Mapping[str, int] = attrs.field(factory=dict, converter=hostile.sorted_counts)
    pull_failures: Mapping[str, int] = attrs.field(factory=dict, converter=hostile.sorted_counts)
    #: distinct messages the consumer read, and acknowledged (SEND_OK) ones it never read
    received: int = 0
    lost: int = 0
    lost_examples: tuple[str, ...] = ()
    #: the longest time between two successful sends (from the first to the last)
    longest_gap_seconds: float = 0.0

    @property
    def sent_ok(self) -> int:
        return self.sends.get(SendStatus.SEND_OK.name, 0)

    def problems(self, max_stall: float) -> list[str]:
        found = []
        if not self.sent_ok:
            found.append("no send was SEND_OK")
        if self.send_failures:
            found.append(f"sends failed: {_format_counts(self.send_failures)}")
        if self.pull_failures:
            found.append(f"pulls failed: {_format_counts(self.pull_failures)}")
        if not self.received:
            found.append("the consumer read nothing")
        if self.lost:
            found.append(f"{self.lost} acknowledged messages never read back "
                         f"(e.g. {', '.join(self.lost_examples)})")
        if self.longest_gap_seconds > max_stall:
            found.append(f"no successful send for {self.longest_gap_seconds:.1f} s "
                         f"(at most {max_stall:g} s allowed)")
        return found


def _format_counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {key}" for key, n in counts.items()) or "none"


@attrs.frozen
class HostileReport:
    seed: int
    seconds: float
    data_dir: str
    attacks: tuple[hostile.AttackOutcome, ...]
    fuzz: tuple[FuzzOutcome, ...]
    good_client: GoodClientOutcome
    nodes: tuple[NodeVerdict, ...]
    stores: tuple[StoreVerdict, ...]
    #: the victim slave's replication state at the end ("refused": it refused the rogue)
    victim_state: str
    max_stall: float

    @property
    def failures(self) -> tuple[str, ...]:
        """What failed, one line each (empty: the run passed)."""
        found = []
        for node in self.nodes:
            if not node.stayed_up:
                found.append(f"node {node.name} (pid {node.pid}) went down during the run "
                             f"(status {node.exit_status})")
            elif node.exit_status != 0:
                found.append(f"node {node.name} (pid {node.pid}) did not stop cleanly "
                             f"(status {node.exit_status})")
        found += [f"good client: {problem}"
                  for problem in self.good_client.problems(self.max_stall)]
        for store in self.stores:
            if not store.clean:
                found.append(f"store {store.name} ({store.path}) does not verify: "
                             + "; ".join(store.damage))
        return tuple(found)

    @property
    def passed(self) -> bool:
        return not self.failures

    def as_json(self) -> dict[str, object]:
        return {
            "passed": self.passed, "failures": list(self.failures), "seed": self.seed,
            "seconds": self.seconds, "data_dir": self.data_dir,
            "attacks": [a.as_json() for a in self.attacks],
            "attack_count": len(self.attacks),
            "fuzz": [f.as_json() for f in self.fuzz],
            "fuzz_frames": sum(f.frames for f in self.fuzz),
            "good_client": {**attrs.asdict(self.good_client), "sent_ok": self.good_client.sent_ok},
            "nodes": [attrs.asdict(n) for n in self.nodes],
            "stores": [attrs.asdict(s) for s in self.stores],
            "victim_state": self.victim_state,
        }

    def human(self) -> str:
        good = self.good_client
        lines = [
            f"trio-ha chaos hostile: seed {self.seed}, {self.seconds:g} s: "
            + ("PASSED" if self.passed else "FAILED"),
            "nodes: " + ", ".join(
                f"{n.name} " + ("up, stopped cleanly" if n.ok else
                                "UP, stop status " + str(n.exit_status) if n.stayed_up
                                else "DOWN") + f" (log {n.log_bytes} bytes)"
                for n in self.nodes),
            f"good client: sends {_format_counts(good.sends)}; failed "
            f"{_format_counts(good.send_failures)}; pulls {_format_counts(good.pulls)}; "
            f"read {good.received}, lost {good.lost}; longest gap between sends "
            f"{good.longest_gap_seconds:.1f} s",
            f"attacks ({len(self.attacks)}):",
        ]
        for a in self.attacks:
            detail = (f"{a.connections} conn, {a.frames_sent} frames, {a.bytes_sent} bytes; "
                      f"closed by node {a.closed_by_node}, refused {a.refused}")
            if a.answers:
                detail += f"; answers: {_format_counts(a.answers)}"
            if a.note:
                detail += f"; {a.note}"
            lines.append(f"  {a.attack} -> {a.target} ({a.seconds:.1f} s): {detail}")
        lines.append(f"fuzz ({sum(f.frames for f in self.fuzz)} frames):")
        for f in self.fuzz:
            top = Counter(f.answers).most_common(4)
            lines.append(
                f"  {f.target} {f.address}: {f.frames} frames in {f.sessions} sessions, "
                f"closed by node {f.closed_by_node}, refused {f.refused}; answers: "
                + (", ".join(f"{n} {k}" for k, n in top) or "none"))
        lines.append(f"victim slave: {self.victim_state}")
        lines.append("stores: " + ", ".join(
            f"{s.name} " + (f"clean ({s.records} records)" if s.clean else "DAMAGED")
            for s in self.stores))
        lines += [f"FAILED: {failure}" for failure in self.failures]
        if not self.passed:
            lines.append(f"the cluster's stores and logs are kept in {self.data_dir}")
        return "\n".join(lines)
