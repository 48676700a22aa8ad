"""What happened in a chaos run, as the clients and the harness saw it.

Every send (its body's id, when it started and ended, the answer or the error), every
message consumed (queue, offset, body id) and every fault (what, when, how long) is one
event, kept in memory for the checker and appended to ``history.jsonl`` in the run
directory as it happens, so a run that dies still leaves what it saw.

In controller mode the harness also records who the controller says is master, each time
that changes (a :class:`MasterEvent`), and each fault names the process it landed on (the
master of that moment, say): the checker counts failovers and write outages from them.

A message's body starts with its id (``p<producer>-<seq>``), unique per send attempt made
by a producer: a body found twice in the log is a retry that stored twice (the client gave
up waiting on an attempt the broker had stored), never two sends.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any

import attrs

__all__ = ["ConsumeEvent", "FaultEvent", "History", "MasterEvent", "SendEvent", "body_id"]


def body_id(body: bytes) -> str:
    """The send id a chaos body starts with (``p1-42 ...``)."""
    return body.split(b" ", 1)[0].decode("ascii", "replace")


@attrs.frozen
class SendEvent:
    id: str
    producer: int
    started: float
    ended: float
    #: SEND_OK, FLUSH_DISK_TIMEOUT, ... or None when the call raised
    status: str | None
    error: str | None = None
    offset_msg_id: str | None = None
    queue_id: int | None = None
    queue_offset: int | None = None


@attrs.frozen
class ConsumeEvent:
    id: str
    at: float
    #: (one broker group: a queue id names the queue)
    queue_id: int
    queue_offset: int
    commitlog_offset: int


@attrs.frozen
class FaultEvent:
    kind: str
    target: int
    started: float
    ended: float
    detail: str = ""
    #: the harness could not make or undo it (``detail`` says why)
    failed: bool = False
    #: the process it landed on (its name; "" where the target says it, or for none) and
    #: that process's client address (a broker's: acks from it carry it in their msg ids)
    node: str = ""
    address: str = ""


@attrs.frozen
class MasterEvent:
    """What the controller said of the broker set at ``at``: its master (a broker's name,
    or None while there is none) and the master epoch, and the in-sync set's size."""

    at: float
    master: str | None
    epoch: int
    in_sync: int = 0
    address: str | None = None


@attrs.define(eq=False)
class History:
    sends: list[SendEvent] = attrs.field(factory=list)
    consumed: list[ConsumeEvent] = attrs.field(factory=list)
    faults: list[FaultEvent] = attrs.field(factory=list)
    masters: list[MasterEvent] = attrs.field(factory=list)
    _out: IO[str] | None = attrs.field(default=None, alias="out")

    @classmethod
    def to_file(cls, path: Path) -> History:
        return cls(out=path.open("a", encoding="utf-8"))

    @classmethod
    def read(cls, path: Path) -> History:
        """The history a run wrote to ``path`` (a last line cut short by the run's death is
        left out; any other damage is an error)."""
        history = cls()
        kinds = {"send": (SendEvent, history.sends), "consume": (ConsumeEvent, history.consumed),
                 "fault": (FaultEvent, history.faults),
                 "master": (MasterEvent, history.masters)}
        lines = path.read_text(encoding="utf-8").split("\n")
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                fields = json.loads(line)
                event_type, into = kinds[fields.pop("event")]
                into.append(event_type(**fields))
            except (ValueError, KeyError, TypeError) as exc:
                if number == len(lines):  # (no newline yet: the line being written)
                    break
                raise ValueError(f"{path}:{number}: not a history event ({exc})") from None
        return history

    def _write(self, kind: str, event: Any) -> None:
        if self._out is not None:
            self._out.write(json.dumps({"event": kind, **attrs.asdict(event)}) + "\n")

    def send(self, event: SendEvent) -> None:
        self.sends.append(event)
        self._write("send", event)

    def consume(self, event: ConsumeEvent) -> None:
        self.consumed.append(event)
        self._write("consume", event)

    def fault(self, event: FaultEvent) -> None:
        self.faults.append(event)
        self._write("fault", event)
        if self._out is not None:
            self._out.flush()

    def master(self, event: MasterEvent) -> None:
        self.masters.append(event)
        self._write("master", event)
        if self._out is not None:
            self._out.flush()

    def close(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None
