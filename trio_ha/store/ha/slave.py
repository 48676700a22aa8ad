"""The slave side of replication: the HA client that copies the master's commitlog.

A session is one connection: report the local log end at once (RocketMQ waits 5 s before
its first report, and the master sends nothing until it has one), then a reader task that
receives frame bodies straight into the active segment's mapping (``readv`` into a view of
the mmap: the bytes never become a Python object) and reports the new log end whenever the
socket is empty (``_Reports``: no task switch between a frame and its ack), and a reporter
task for heartbeats and what the socket would not take at once. Either failing ends the session,
and the client connects again after a back-off (``_Backoff``): ha_reconnect_min_interval
(20 ms) after a session that had frames from its master, doubling after each attempt that had
none, up to ha_reconnect_interval (40 ms) for the first ha_reconnect_fast_period (10 s) of the
outage — the time a restarting master takes — and beyond it up to ha_reconnect_max_interval
(2 s). RocketMQ waits a fixed 5 s, so a SYNC_MASTER that restarts in a second answers
SLAVE_NOT_AVAILABLE for seconds more; here the slave is back within about
ha_reconnect_interval of a restarted master's port opening, and a master that stays down costs
one refused connect per ha_reconnect_max_interval (it was 25 a second for as long as it was
down).

A slave without haMasterAddress follows the master the name server names
(``follow_master_address``). With haAuthSecret it moves only to a master that passes the
handshake: the new address is tried on a connection of its own while the current session
goes on, and the connection becomes the session once the master has proved itself. One that
fails is not followed: the slave stays with the master it had, says so in one line, and does
not try that address again for NOT_FOLLOWED_RETRY seconds, however often it is named (the
name server answers every registration, every 30 s or every second while the slave has no
master). A master the name server names that cannot be reached is not held against it: it
is tried again at the next registration, since a new master's port may simply not be open yet.

A master that goes silent for haHousekeepingInterval ends the session too (RocketMQ 4.9.8
times out only on its own writes, so a silent master is never noticed).

A frame that does not continue the local log means the two logs diverged: the slave is
behind what the master still keeps (RocketMQ #3388), or holds bytes the master lost. The
client stops, enters the ``diverged`` state with both offsets in its statistics and the log,
and waits for an operator — rather than RocketMQ's endless reconnect loop (#323). Its error line
(``divergence_advice``) names both possibilities when the slave is ahead (the master may be the
wrong one: an empty broker under the same name, or one that lost its disk) and the order that
keeps the only good copy; every step is a ``trio-ha`` command or a restart. The state lives in
memory only: a restart of the slave, a new master address or ``clear_divergence`` (for an
embedded store) tries again, and a master still diverged is simply reported again.

An empty slave's log begins where the master's first data frame says, which must be where a
log can begin: a segment boundary whose segment ends at a 64-bit offset. A master that says
otherwise (a rogue one, or one with another mappedFileSizeCommitLog) is refused: the client
stops in the ``refused`` state, with the reason in its statistics, and has written nothing.

Why one module at about 600 lines: it is the HA client, one object with the small parts of
its session (the back-off, the reports, the statistics, the divergence advice), all serving
one connection's life and the states it ends in; the frames are ``wire.ha``'s, and the
controller-mode client (``autoswitch_slave``) is this one with a handshake in front.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Protocol, TypeVar

import attrs
import trio

from ..._errors import TrioHAError
from ...config import StoreConfig
from ...ratelog import RateLimitedLog
from ...watermark import Watermark
from ...wire.ha import (
    NEED_DATA,
    FrameData,
    FrameHeader,
    HAProtocolError,
    OffsetMismatch,
    SlaveProtocol,
)
from ...wire.record import parse_host_port
from ..commitlog import CommitLog, ReplicaOffsetError, ReplicaStartError
from .auth import HANDSHAKE_TIMEOUT, authenticate_master
from .transfer import HATransport, SocketTransport

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 5.0
#: a master the name server named that failed the handshake is not tried again for this long
NOT_FOLLOWED_RETRY = 10.0
#: addresses remembered as not followed, at most (a name server cannot grow the table)
MAX_NOT_FOLLOWED = 64
#: a slave whose socket never empties (catching up) reports and yields every this many bytes
YIELD_BYTES = 1024 * 1024

_E = TypeVar("_E", bound=Exception)


class MasterConnectionLost(TrioHAError):
    """The master closed the connection or went silent."""


class HAClientState(enum.StrEnum):
    """Where a slave's replication stands (a str: logs and admin tables print it as is)."""

    #: no master address to copy from
    IDLE = "idle"
    CONNECTING = "connecting"
    #: connected, proving the shared secret to the master and checking its proof
    #: (haAuthSecret)
    AUTHENTICATING = "authenticating"
    #: connected, AutoSwitch only: waiting for the master's epoch list, then truncating the
    #: log to the point both agree on (``autoswitch_slave``)
    HANDSHAKE = "handshake"
    #: connected, copying the master's log
    TRANSFER = "transfer"
    #: the last session failed; the next attempt comes after the back-off (see the module)
    BACKOFF = "backoff"
    #: the logs differ; replication waits for an operator (``clear_divergence``)
    DIVERGED = "diverged"
    #: the master would start this empty log where no log can begin; replication waits for
    #: an operator (``clear_divergence``) or another master
    REFUSED = "refused"


async def _connect_tcp(address: str) -> HATransport:
    host, port = parse_host_port(address)
    return SocketTransport(await trio.open_tcp_stream(host, port))


@attrs.frozen
class HASlaveStatistics:
    master_address: str | None
    state: HAClientState
    local_max_offset: int
    connected_since: float | None
    last_frame_time: float | None
    bytes_received: int
    divergence: str | None
    last_error: str | None
    #: why the master's start offset was refused (state ``refused``)
    refusal: str | None = None
    #: of ``bytes_received``, those spliced from the socket into the segment files with no
    #: copy through Python (large frames; 0 where the system refuses splice)
    bytes_spliced: int = 0


def divergence_advice(address: str, slave_end: int, master_answer: int,
                      store_dir: str) -> tuple[str, str]:
    """What a slave says when its master answered ``master_answer`` to its log end
    ``slave_end``: why replication stopped (``statistics().ha_slave.divergence``, shown by
    ``trio-ha status``) and what an operator does about it, in the order that loses nothing.

    A master answers a slave that is ahead of it with its first offset, never its end, so
    the slave cannot tell an empty master from a short one. Either way, when the slave is
    ahead, the likelier truth is that the master is the wrong one (an empty or new broker
    registered under this brokerName after the real master went, or a master that lost its
    disk) and this slave holds the only good copy: the advice keeps it until the master has
    been checked, and cuts it only once the master is known to be right. Every step is a
    command (docs/ha-protocol.md, "A diverged slave")."""
    if master_answer > slave_end:
        why = (f"the master's log continues at {master_answer} but this slave's ends at "
               f"{slave_end}: the bytes in between are gone from the master (the slave was "
               "away longer than the master keeps data)")
        advice = (f"Fix: the master holds everything from {master_answer} on; stop this "
                  f"slave, move its store aside (mv {store_dir} {store_dir}.old: it holds "
                  "only messages the master has already deleted) and start it: it copies "
                  "afresh from the master.")
        return why, advice
    empty = ", as an empty master does" if master_answer == 0 else ""
    why = (f"this slave's log ends at {slave_end}, beyond the master's (it answered at "
           f"{master_answer}{empty}): either the master is the "
           "wrong one (an empty or new broker registered under this brokerName, or the "
           "master lost its tail or its disk) and this slave holds the only good copy, or "
           "the master is right and this slave holds bytes it never had")
    advice = (f"KEEP THIS SLAVE'S STORE ({store_dir}): do not wipe or truncate it yet. Safe "
              f"order: 1) check the master at {address}: `trio-ha store inspect DIR` on its "
              "host (its log end and store times) against this slave's, or `trio-ha store "
              "verify DIR`; 2) if the master is the wrong one, stop it and bring back the "
              "real master's store (or make this slave the master: brokerId=0 and "
              "brokerRole=SYNC_MASTER or ASYNC_MASTER in its broker.conf, after a copy of "
              f"its store), then restart this slave (a restart clears this state; a master "
              "at another address is followed by itself); 3) only if the master is right: "
              f"stop this slave, copy its store aside (cp -a {store_dir} "
              f"{store_dir}.diverged), run `trio-ha store truncate {store_dir} --to "
              "<the master's log end> --dry-run`, then without --dry-run, and start it.")
    return why, advice


@attrs.define(eq=False)
class HAClient:
    config: StoreConfig
    commitlog: CommitLog
    master_address: str | None = None
    state: HAClientState = HAClientState.IDLE
    connected_since: float | None = None
    last_frame_time: float | None = None
    bytes_received: int = 0
    divergence: str | None = None
    refusal: str | None = None
    last_error: str | None = None
    #: opens a transport to the master; TCP by default (tests pass memory streams)
    connect: Callable[[str], Awaitable[HATransport]] = _connect_tcp
    _wakeup: trio.Event = attrs.field(factory=trio.Event)
    _session_scope: trio.CancelScope | None = None
    #: the current session's transport, and what the ended sessions spliced
    _transport: HATransport | None = None
    _spliced_before: int = 0
    #: the current session has had a frame from its master
    _served: bool = False
    #: a master that stays down fails a connect every back-off ceiling (25 a second): one
    #: line per 10 s says so, with the count
    _failures: RateLimitedLog = attrs.field(factory=lambda: RateLimitedLog(log))
    #: where ``follow_master_address`` tries a new master (the client's own, while it runs)
    _nursery: trio.Nursery | None = None
    #: addresses being tried, and those that failed the handshake (-> when, trio clock)
    _probing: set[str] = attrs.field(factory=set[str])
    _not_followed: dict[str, float] = attrs.field(factory=dict[str, float])
    #: a connection to a new master that passed the handshake, for the next session
    _proven: tuple[str, HATransport] | None = None

    def follow_master_address(self, address: str | None,
                              on_followed: Callable[[], None] | None = None) -> None:
        """The name server names ``address`` as the master's HA address. Without
        haAuthSecret it is followed at once (``update_master_address``); with it, only once
        it passes the handshake on a connection of its own, while the current session goes
        on; then ``on_followed()`` runs. One that fails is not followed (see the module)."""
        if address is None or address in self._probing:
            return
        if address == self.master_address:  # followed already (its other address may move)
            if on_followed is not None:
                on_followed()
            return
        if self.config.ha_auth_secret is None or self._nursery is None:
            self.update_master_address(address)
            if on_followed is not None:
                on_followed()
            return
        failed_at = self._not_followed.get(address)
        if failed_at is not None and trio.current_time() - failed_at < NOT_FOLLOWED_RETRY:
            return
        self._probing.add(address)
        self._nursery.start_soon(self._try_master, address, self.config.ha_auth_secret,
                                 on_followed)

    async def _try_master(self, address: str, secret: str,
                          on_followed: Callable[[], None] | None) -> None:
        transport: HATransport | None = None
        proven = False
        try:
            with trio.fail_after(CONNECT_TIMEOUT + HANDSHAKE_TIMEOUT):
                transport = await self.connect(address)
                await authenticate_master(transport, secret)
            proven = True
        except OSError as exc:  # not there (yet): the next registration tries again
            log.debug("HA: master %s named by the name server not reachable: %s", address, exc)
            return
        except (HAProtocolError, trio.TooSlowError, trio.BrokenResourceError,
                trio.ClosedResourceError) as exc:
            self._not_follow(address, exc)
            return
        finally:
            self._probing.discard(address)
            if not proven:  # also when cancelled: the connection is not left open
                await self._close(transport)
        assert transport is not None
        self._not_followed.pop(address, None)
        if self._proven is not None:
            await self._close(self._proven[1])
        self._proven = (address, transport)
        self.update_master_address(address)
        if on_followed is not None:
            on_followed()

    def _not_follow(self, address: str, exc: BaseException) -> None:
        again = address in self._not_followed
        if not again and len(self._not_followed) >= MAX_NOT_FOLLOWED:
            del self._not_followed[min(self._not_followed, key=self._not_followed.__getitem__)]
        self._not_followed[address] = trio.current_time()
        if not again:  # one line per address, not one per try
            why = (str(exc) or type(exc).__name__) if not isinstance(exc, trio.TooSlowError) \
                else "no handshake within the timeout"
            log.warning("HA: not following %s, which the name server names as master: it "
                        "failed authentication (%s); staying with %s", address, why,
                        self.master_address or "no master")

    @staticmethod
    async def _close(transport: HATransport | None) -> None:
        if transport is not None:
            with trio.CancelScope(shield=True):
                await transport.aclose()

    def update_master_address(self, address: str | None) -> None:
        """Follow a (new) master. A session with the old one ends; a divergence recorded
        against the old master is forgotten."""
        if address == self.master_address:
            return
        self.master_address = address
        self.divergence = self.refusal = None
        if self._session_scope is not None:
            self._session_scope.cancel()
        self._wakeup.set()

    def clear_divergence(self) -> None:
        """The operator repaired the store (or the master): try replicating again, after a
        divergence or a refused start."""
        self.divergence = self.refusal = None
        self._wakeup.set()

    @property
    def _stopped(self) -> HAClientState | None:
        """DIVERGED or REFUSED while replication waits for an operator, else None."""
        if self.divergence is not None:
            return HAClientState.DIVERGED
        if self.refusal is not None:
            return HAClientState.REFUSED
        return None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                await self._run(task_status)
            finally:
                self._nursery = None
                if self._proven is not None:
                    await self._close(self._proven[1])
                    self._proven = None

    async def _run(self, task_status: trio.TaskStatus[None]) -> None:
        task_status.started()
        backoff = _Backoff.of(self.config)
        while True:
            if self.master_address is None or self._stopped is not None:
                self.state = self._stopped or HAClientState.IDLE
                self._wakeup = trio.Event()
                await self._wakeup.wait()
                continue
            address = self.master_address
            failed = False
            with trio.CancelScope() as scope:
                self._session_scope = scope
                try:
                    await self._session(address)
                except* OffsetMismatch as group:
                    self._diverged(address, _first_of(group))
                except* ReplicaStartError as group:
                    self._refused(address, _first_of(group))
                except* (OSError, HAProtocolError, ReplicaOffsetError, MasterConnectionLost,
                         trio.BrokenResourceError, trio.ClosedResourceError,
                         trio.TooSlowError) as group:
                    failed = True
                    self.last_error = str(group.exceptions[0])
                    kind = ("session ended", address)
                    if self._served:  # a master that was serving went: said at once
                        self._failures.ended(kind)
                    self._failures.log(logging.WARNING, kind,
                                       "HA: session with master %s ended: %s", address,
                                       self.last_error)
            self._session_scope = None
            self.connected_since = None
            if self._served:  # that master was serving: worth trying again soon
                backoff.attached()
            if failed and self.master_address == address and self._stopped is None:
                self.state = HAClientState.BACKOFF
                self._wakeup = trio.Event()
                with trio.move_on_after(backoff.next_wait()):
                    await self._wakeup.wait()

    def _diverged(self, address: str, exc: OffsetMismatch) -> None:
        why, advice = divergence_advice(address, exc.expected, exc.received,
                                        self.config.store_path_root_dir)
        self.divergence = why
        self.state = HAClientState.DIVERGED
        log.error("HA: replication from %s stopped: %s. %s", address, why, advice)

    def _refused(self, address: str, exc: ReplicaStartError) -> None:
        self.refusal = str(exc)
        self.state = HAClientState.REFUSED
        log.error(
            "HA: replication from %s refused: %s. Nothing was written. Fix: check that %s is "
            "this slave's master and that both use the same mappedFileSizeCommitLog, then "
            "restart this slave (or call clear_divergence() where it is embedded).", address,
            exc, address,
        )

    async def _session(self, address: str) -> None:
        transport = await self._open_session(address)
        self._transport = transport
        try:
            await self._replicate(transport, address)
        finally:
            self._spliced_before += transport.bytes_spliced
            self._transport = None
            with trio.CancelScope(shield=True):
                await transport.aclose()

    async def _open_session(self, address: str) -> HATransport:
        """A transport to the master at ``address`` that passed the authentication
        handshake, if the store has haAuthSecret (the caller closes it)."""
        self.state = HAClientState.CONNECTING
        self._served = False
        proven, self._proven = self._proven, None
        if proven is not None and proven[0] == address:
            transport = proven[1]  # it passed the handshake already (follow_master_address)
        else:
            if proven is not None:
                await self._close(proven[1])
            proven = None
            with trio.fail_after(CONNECT_TIMEOUT):
                transport = await self.connect(address)
        secret = self.config.ha_auth_secret
        if secret is not None and proven is None:
            self.state = HAClientState.AUTHENTICATING
            try:
                with trio.fail_after(HANDSHAKE_TIMEOUT):
                    await authenticate_master(transport, secret)
            except BaseException:
                await self._close(transport)
                raise
        return transport

    async def _replicate(self, transport: HATransport, address: str) -> None:
        """Copy the master's log over ``transport`` until the session ends (the classic
        protocol: report the log end, then receive frames)."""
        commitlog = self.commitlog
        local_end = commitlog.max_offset
        protocol = SlaveProtocol(expected=local_end if commitlog.segments.segments else None)
        await transport.send_all(protocol.send_report(local_end))
        self.state = HAClientState.TRANSFER
        self.connected_since = time.time()
        log.info("HA: replicating from %s, local log ends at %d", address, local_end)
        reports = _Reports(transport, protocol, commitlog.written, local_end,
                           self.config.ha_send_heartbeat_interval / 1000)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reports.run)
            await self._receive(transport, protocol, reports)

    async def _receive(self, transport: HATransport, protocol: SlaveProtocol,
                       reports: _Reports) -> None:
        commitlog = self.commitlog
        silence = self.config.ha_housekeeping_interval / 1000
        body_offset = 0  # log offset of the next body byte
        frame_size = 0  # bytes in the body being received
        report = reports.before_wait
        unyielded = 0  # bytes received since this task last let others run
        # One deadline for the session, moved on after every read (a scope per read cost
        # more than the read on a catching-up slave).
        with trio.CancelScope(deadline=trio.current_time() + silence) as quiet:
            while True:
                wanted = protocol.bytes_wanted
                if protocol.body_remaining:
                    segment = await commitlog.replica_segment(body_offset)
                    start = segment.wrote_position
                    n = await transport.receive_into_segment_eagerly(
                        segment, start, start + min(wanted, segment.size - start), frame_size,
                        report)
                    if n == 0:
                        raise MasterConnectionLost("master closed the connection")
                    commitlog.replica_appended(segment, n)
                    protocol.body_received(n)
                    body_offset += n
                else:
                    data = await transport.receive_eagerly(wanted, report)
                    if not data:
                        raise MasterConnectionLost("master closed the connection")
                    n = len(data)
                    protocol.receive_data(data)
                quiet.deadline = trio.current_time() + silence
                while (event := protocol.next_event()) is not NEED_DATA:
                    if isinstance(event, FrameHeader):
                        self.last_frame_time = time.time()
                        self._served = True
                        body_offset = event.offset
                        frame_size = event.size
                    elif isinstance(event, FrameData):
                        body_offset = await commitlog.append_replica(body_offset, event.data)
                    else:  # the frame's end (FrameEnd)
                        self.bytes_received += event.size
                if reports.drained:  # this receive waited: others ran meanwhile
                    reports.drained = False
                    unyielded = n
                else:
                    # The receives do not yield while bytes keep coming (a catching-up
                    # slave): report and let the dispatcher run every so often.
                    unyielded += n
                    if unyielded >= YIELD_BYTES:
                        unyielded = 0
                        reports.report_now()
                        await trio.lowlevel.checkpoint()
        raise MasterConnectionLost(f"master silent for {silence:g} s")

    def statistics(self) -> HASlaveStatistics:
        return HASlaveStatistics(
            master_address=self.master_address,
            state=self.state,
            local_max_offset=self.commitlog.max_offset,
            connected_since=self.connected_since,
            last_frame_time=self.last_frame_time,
            bytes_received=self.bytes_received,
            divergence=self.divergence,
            last_error=self.last_error,
            refusal=self.refusal,
            bytes_spliced=self._spliced_before
            + (self._transport.bytes_spliced if self._transport is not None else 0),
        )


@attrs.define(eq=False)
class _Backoff:
    """How long a slave waits before it tries its master again (see the module): fast while
    a restart is likely, then towards seconds while the master stays down."""

    shortest: float
    fast_ceiling: float
    #: how long the fast ceiling lasts, from the first failure since the slave was served
    fast_period: float
    ceiling: float
    _wait: float | None = None
    _outage_since: float | None = None

    @classmethod
    def of(cls, config: StoreConfig) -> _Backoff:
        fast = config.ha_reconnect_interval / 1000
        return cls(shortest=min(config.ha_reconnect_min_interval / 1000, fast),
                   fast_ceiling=fast, fast_period=config.ha_reconnect_fast_period / 1000,
                   ceiling=max(config.ha_reconnect_max_interval / 1000, fast))

    def attached(self) -> None:
        """A session had frames from its master: the next outage starts fast again."""
        self._wait = self._outage_since = None

    def next_wait(self) -> float:
        """The wait after a failed attempt, from now."""
        now = trio.current_time()
        if self._outage_since is None:
            self._outage_since = now
        if self._wait is None:
            self._wait = self.shortest
        else:
            fast = now - self._outage_since < self.fast_period
            self._wait = min(self._wait * 2, self.fast_ceiling if fast else self.ceiling)
        return self._wait


class ReportEncoder(Protocol):
    """What ``Reports`` needs of a protocol: the bytes that report a log end (the classic
    8-byte report, or the AutoSwitch ack)."""

    def send_report(self, offset: int) -> bytes: ...


@attrs.define(eq=False)
class _Reports:
    """How a session tells the master where the slave's log ends.

    The receiver reports itself, with one non-blocking write, whenever it has taken every
    byte the socket held (``before_wait``, just before it waits for more) and the log grew:
    a SYNC_MASTER put's frame is acknowledged in the scheduling round it arrives in, with
    no task switch. A catching-up slave, whose socket is never empty, reports every
    YIELD_BYTES instead. The task (``run``) sends what the receiver could not (the socket
    was full, or the transport cannot write without waiting) and a report every
    haSendHeartbeatInterval when nothing else went, so the master hears from its slave."""

    transport: HATransport
    protocol: ReportEncoder
    written: Watermark
    #: the last log end sent (or being sent)
    reported: int
    #: seconds between reports at the least (haSendHeartbeatInterval)
    interval: float
    #: the receiver waited since it last looked (it yielded; set by ``before_wait``)
    drained: bool = False
    _last_sent: float = attrs.field(factory=trio.current_time)
    #: the tail of a report the socket took only part of: the task sends it
    _unsent: bytes = b""
    _sending: bool = False
    _due: trio.Event = attrs.field(factory=trio.Event)

    def before_wait(self) -> None:
        self.drained = True
        self.report_now()

    def report_now(self) -> None:
        """Report the log end now if it grew (the task does it if this cannot)."""
        end = self.written.value
        if end <= self.reported:
            return
        if self._sending or self._unsent:
            self._due.set()
            return
        data = self.protocol.send_report(end)
        sent = self.transport.send_nowait(data)
        if not sent:
            self._due.set()
            return
        self.reported = end
        self._last_sent = trio.current_time()
        if sent < len(data):
            self._unsent = data[sent:]
            self._due.set()

    async def run(self) -> None:
        while True:
            with trio.move_on_at(self._last_sent + self.interval):
                await self._due.wait()
            self._due = trio.Event()
            self._sending = True
            try:
                if self._unsent:
                    unsent, self._unsent = self._unsent, b""
                    await self.transport.send_all(unsent)
                end = max(self.reported, self.written.value)
                if end > self.reported or trio.current_time() >= self._last_sent + self.interval:
                    self.reported = end
                    self._last_sent = trio.current_time()
                    await self.transport.send_all(self.protocol.send_report(end))
            finally:
                self._sending = False


#: the session's reporter, for the AutoSwitch client too (``autoswitch_slave``), whose acks
#: follow the same rules: from the receiver when the socket is empty, else from its task
Reports = _Reports


def _first_of(group: ExceptionGroup[_E]) -> _E:
    """The first exception of ``group``, however deeply it is nested."""
    for exc in _leaves(group):
        return exc
    raise AssertionError("an exception group is never empty")


def _leaves(group: BaseExceptionGroup[_E]) -> Iterator[_E]:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from _leaves(exc)
        else:
            yield exc
