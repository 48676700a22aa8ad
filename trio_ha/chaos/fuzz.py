"""A seeded fuzzer for a node's ports: the mutated frames of ``fuzz_frames``, over real
sockets.

What to send is drawn in ``fuzz_frames`` (templates of valid frames, their mutations and
``Fuzzer``, the seeded draw; its docstring says what is fuzzed, by port, and what is left
out on purpose). This module sends them: sessions of up to ``FRAMES_PER_SESSION`` frames,
each on a fresh connection, the node's answers read and counted after each session, every
target at once, each bounded by a deadline and a frame count; and, for a slave, the script a
``RogueHAMaster`` runs to serve it mutated master frames. The outcome counts what was sent
(by mutation) and how the node answered (response codes, closed connections). The names
of ``fuzz_frames`` a caller uses are re-exported here, so the fuzzer is imported from one
place.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Mapping, Sequence

import attrs
import trio

from ..wire.errors import WireError
from ..wire.ha import NEED_DATA, REPORT
from ..wire.remoting import FrameDecoder
from .fuzz_frames import (
    FUZZ_TOPIC,
    REMOTING_MUTATIONS,
    WHOLE_FRAME_MUTATIONS,
    Fuzzer,
    FuzzTarget,
    TargetKind,
    broker_templates,
    mutate_master_frames,
    mutate_reports,
    namesrv_templates,
    would_start_a_log,
)
from .hostile import (
    RogueHAMaster,
    Script,
    close_quietly,
    code_name,
    connect_raw,
    node_has_closed,
    receive_exactly,
    send_until_closed,
    sorted_counts,
)

__all__ = [
    "FUZZ_TOPIC", "REMOTING_MUTATIONS", "WHOLE_FRAME_MUTATIONS", "FuzzOutcome", "FuzzTarget",
    "Fuzzer", "MasterFrameFuzz", "TargetKind", "broker_templates", "fuzz_target",
    "fuzz_targets", "master_frame_script", "mutate_master_frames", "mutate_reports",
    "namesrv_templates", "would_start_a_log",
]

#: frames one connection carries at most before the fuzzer hangs up and opens another
FRAMES_PER_SESSION = 8


@attrs.frozen
class FuzzOutcome:
    """What the fuzzer sent one target and how the node answered."""

    target: str
    kind: str
    address: str
    sessions: int = 0
    frames: int = 0
    bytes_sent: int = 0
    #: connections the node closed while the fuzzer still had something to say or read
    closed_by_node: int = 0
    #: connections the node refused: connects that failed, and connections it closed before
    #: the first frame went out (at its connection limit, or gone)
    refused: int = 0
    #: frames sent, by mutation
    mutations: Mapping[str, int] = attrs.field(factory=dict, converter=sorted_counts)
    #: the node's answers: response code names, "undecodable", "bytes" (HA data)
    answers: Mapping[str, int] = attrs.field(factory=dict, converter=sorted_counts)
    seconds: float = 0.0

    def as_json(self) -> dict[str, object]:
        return attrs.asdict(self)


@attrs.define
class _Tally:
    target: FuzzTarget
    started: float = attrs.field(factory=time.monotonic)
    sessions: int = 0
    frames: int = 0
    bytes_sent: int = 0
    closed_by_node: int = 0
    refused: int = 0
    mutations: Counter[str] = attrs.field(factory=Counter)
    answers: Counter[str] = attrs.field(factory=Counter)

    def outcome(self) -> FuzzOutcome:
        return FuzzOutcome(
            self.target.name, self.target.kind.value, self.target.address, self.sessions,
            self.frames, self.bytes_sent, self.closed_by_node, self.refused,
            dict(self.mutations), dict(self.answers), round(time.monotonic() - self.started, 3),
        )

async def _read_answers(stream: trio.SocketStream, tally: _Tally, kind: TargetKind,
                        seconds: float) -> bool:
    """Read the node's answers for ``seconds``: True if it closed the connection."""
    decoder = FrameDecoder()
    framed = kind is not TargetKind.HA_MASTER
    with trio.move_on_after(seconds):
        try:
            while data := await stream.receive_some(65536):
                if not framed:
                    tally.answers["bytes"] += len(data)
                    continue
                try:
                    decoder.receive_data(data)
                    while (command := decoder.next_command()) is not NEED_DATA:
                        tally.answers[code_name(command.code)] += 1
                except WireError:
                    tally.answers["undecodable"] += 1
                    framed = False
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        return True
    return False


async def fuzz_target(target: FuzzTarget, *, seed: int, seconds: float, max_frames: int,
                      answer_seconds: float = 0.1) -> FuzzOutcome:
    """Fuzz one target until ``seconds`` pass or ``max_frames`` frames went out: sessions of
    up to FRAMES_PER_SESSION frames each, the node's answers read for ``answer_seconds``
    after each session's frames."""
    fuzzer = Fuzzer.for_target(target, seed)
    tally = _Tally(target)
    deadline = trio.current_time() + seconds
    await trio.lowlevel.checkpoint()
    with trio.move_on_at(deadline):
        while tally.frames < max_frames:
            try:
                stream = await connect_raw(target.address)
            except OSError:
                tally.refused += 1
                await trio.sleep(0.05)  # a node at its limit, or gone: do not spin
                continue
            try:
                sent = 0
                closed = False
                count = fuzzer.rng.randint(1, FRAMES_PER_SESSION)
                whole_frames = fuzzer.rng.random() < 0.5
                for _ in range(min(count, max_frames - tally.frames)):
                    name, data = fuzzer.next_frame(whole_frames=whole_frames)
                    if not await send_until_closed(stream, data):
                        closed = True
                        break
                    sent += 1
                    tally.mutations[name] += 1
                    tally.frames += 1
                    tally.bytes_sent += len(data)
                if closed and not sent:
                    # closed before its first frame: the node refused the connection (at its
                    # limit, while a flood holds it); counted apart, and no spinning
                    tally.refused += 1
                    await trio.sleep(0.05)
                    continue
                tally.sessions += 1
                answered = sum(tally.answers.values())
                if closed or await _read_answers(stream, tally, target.kind,
                                                       answer_seconds):
                    tally.closed_by_node += 1
                    if sum(tally.answers.values()) == answered:
                        # closed without a word: a frame it refused, or a connection it
                        # refused (a flood holds it at its limit): a pause, not a spin
                        await trio.sleep(0.02)
            finally:
                await close_quietly(stream)
    return tally.outcome()


async def fuzz_targets(targets: Sequence[FuzzTarget], *, seed: int, seconds: float,
                       max_frames: int) -> list[FuzzOutcome]:
    """Fuzz every target at once, each with its own stream of draws from ``seed``."""
    outcomes: dict[str, FuzzOutcome] = {}

    async def one(target: FuzzTarget) -> None:
        outcomes[target.name] = await fuzz_target(target, seed=seed, seconds=seconds,
                                                  max_frames=max_frames)

    async with trio.open_nursery() as nursery:
        for target in targets:
            nursery.start_soon(one, target)
    return [outcomes[target.name] for target in targets]


# ---- master frames, for a slave pointed at a RogueHAMaster -----------------------------------


@attrs.define
class MasterFrameFuzz:
    """Counts for the master-frame fuzzing of one slave."""

    frames: int = 0
    bytes_sent: int = 0
    mutations: Counter[str] = attrs.field(factory=Counter)

    def outcome(self, rogue: RogueHAMaster, seconds: float) -> FuzzOutcome:
        return FuzzOutcome("slave HA client", "HA slave", rogue.address or "", rogue.sessions,
                           self.frames, self.bytes_sent, rogue.ended_by_slave, 0,
                           dict(self.mutations), {}, round(seconds, 3))


def master_frame_script(seed: int, counts: MasterFrameFuzz, *,
                        wait_seconds: float = 0.3) -> Script:
    """A RogueHAMaster script: read the slave's first report, send one stream of mutated
    master frames, and wait ``wait_seconds`` for the slave to end the session."""
    rng = random.Random(f"{seed}:master frames")

    async def script(stream: trio.SocketStream, session: int) -> None:
        await receive_exactly(stream, REPORT.size, 5.0)
        name, data = mutate_master_frames(rng)
        counts.mutations[name] += 1
        counts.frames += 1
        if await send_until_closed(stream, data):
            counts.bytes_sent += len(data)
        with trio.move_on_after(wait_seconds):
            while True:
                if node_has_closed(stream):
                    return
                await trio.sleep(0.02)

    return script
