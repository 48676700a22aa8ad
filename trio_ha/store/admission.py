"""Admission: whether the store takes a put now, and what a put it takes looks like encoded.

A put is refused before it touches the log when the store is not running or is closing, is
cutting its log back (``truncation``), is a slave (``roles``), cannot build its consume
queues (the dispatcher's error or stall), is short of disk (``health``), or, in controller
mode, when the master's in-sync set is too small for a put that waits for it (``gate``);
and when the put itself is bad: a topic that is not a topic name, a queue id out of range, a
body above maxMessageSize. A refusal is a ``PutMessageResult`` with its status and remark,
counted (``put_failures``), never an exception in the broker; so is a record the encoder
refuses (``encoder_refused``).

This runs per message, at 10^4-10^5 puts a second, so it has two forms. ``accepts`` is the
fast one: one flag for everything that changes only with the store's life and role
(``accepting``: running, open, a master, not cutting, no in-sync gate), the two conditions
that change under the store (the dispatcher's, the disk's), the put's own numbers, and the
encoded topic from a cache. ``admit`` is the full check, with the reasons, which a put takes
only when the fast one answers None. The encoded topics and born hosts are cached here: a
store sees few of each, and a put should not pay a check and an encoding for either.

The store owns one ``Admission`` (``MessageStore.admission``), and its put path calls it in
place of methods of its own (no call more per put: the store's ``_accepts`` was a call too).
Its fields are public, so that the role changes and the truncation read them without
reaching into the store's privates; they change only through the methods here, each of which
keeps ``accepting`` true to the rest.
"""

from __future__ import annotations

import attrs

import trio_ha._backend as _backend

from ..config import BrokerRole, StoreConfig
from ..wire import layout
from ..wire import record as rec
from .consume_queue import is_valid_topic
from .dispatch import Dispatcher
from .ha.sync_state import SyncState
from .health import DiskMonitor
from .results import PutMessageResult, PutMessageStatus

# The record encoder reserves 64 KiB beyond the body limit for the rest of the record.
RECORD_OVERHEAD_LIMIT = 64 * 1024
#: the remark of a put refused for too small an in-sync set (RocketMQ's broker answers it)
IN_SYNC_REPLICAS_NOT_ENOUGH = "in-sync replicas not enough"
#: at most this many encoded topics and born hosts are cached (a store sees few of each)
_TOPICS_CACHED = 65536
_HOSTS_CACHED = 4096


def max_record_size(config: StoreConfig) -> int:
    """The largest record a store with ``config`` takes or accepts when it scans."""
    return min(config.max_message_size + RECORD_OVERHEAD_LIMIT, layout.INT32_MAX)


@attrs.define(eq=False)
class Admission:
    """The store's door for puts: its state, the checks, the caches and the counts."""

    config: StoreConfig
    dispatcher: Dispatcher
    disk: DiskMonitor
    #: the store's own host, encoded: the born host of a put that names none
    store_host: bytes
    #: the role now (``roles``): the configured one until a change
    role: BrokerRole
    running: bool = False
    closed: bool = False
    #: a truncation is under way: puts are refused until it is done
    truncating: bool = False
    #: a controller-mode master whose puts need minInSyncReplicas: the term's in-sync set,
    #: asked by every put (which then takes the full check, ``admit``); None otherwise
    in_sync_gate: SyncState | None = None
    #: running, open, a master, not cutting, no gate: the fast path's one check
    accepting: bool = False
    #: messages appended, and puts refused
    puts: int = 0
    put_failures: int = 0
    topics: dict[str, bytes] = attrs.field(factory=dict[str, bytes])
    born_hosts: dict[str, bytes] = attrs.field(factory=dict[str, bytes])

    # ---- the store's life and role -----------------------------------------------------------

    def _refresh(self) -> None:
        self.accepting = (self.running and not self.closed and not self.truncating
                          and self.role is not BrokerRole.SLAVE and self.in_sync_gate is None)

    def mark_running(self) -> None:
        self.running = True
        self._refresh()

    def mark_closed(self) -> None:
        self.closed = True
        self.accepting = False

    def take_role(self, role: BrokerRole) -> None:
        self.role = role
        self._refresh()

    def gate(self, sync_state: SyncState | None) -> None:
        """Puts that wait for slaves are refused while ``sync_state`` does not admit them; a
        set whose minInSyncReplicas is 1 always does (it holds its master), so it needs no
        gate and its puts keep the fast path."""
        self.in_sync_gate = (
            sync_state if sync_state is not None and sync_state.min_in_sync_replicas > 1
            else None
        )
        self._refresh()

    def cut_refusal(self, for_new_master: bool) -> str | None:
        """Why the log cannot be cut now (``truncation.truncate_to``), or None."""
        if self.closed or not self.running:
            return "the store is not running"
        if self.truncating:
            return "a truncation is already under way"
        if self.accepting and not for_new_master:
            return "the store takes puts (a master): only the change-to-master path may cut it"
        return None

    def begin_cut(self) -> bool:
        """Refuse puts while the log is cut; whether they were taken before."""
        accepting = self.accepting
        self.truncating, self.accepting = True, False
        return accepting

    def end_cut(self, accepting: bool) -> None:
        """The cut is over (done, or refused with nothing changed): puts as before it,
        unless the store closed meanwhile. (A cut that failed half-way never comes here:
        the store refuses puts until it is reopened.)"""
        self.truncating = False
        self.accepting = accepting and not self.closed

    # ---- a put --------------------------------------------------------------------------------

    def accepts(self, topic: str, queue_id: int, body_len: int) -> bytes | None:
        """The fast path of ``admit``: the encoded topic when nothing stands in the way."""
        dispatcher = self.dispatcher
        if (
            self.accepting
            and dispatcher.error is None
            and dispatcher.stalled is None
            and self.disk.full is None
            and 0 <= queue_id <= layout.INT32_MAX
            and body_len <= self.config.max_message_size
        ):
            return self.topics.get(topic)
        return None

    def admit(self, topic: str, queue_id: int, body_len: int,
              wait: bool) -> bytes | PutMessageResult:
        """The encoded topic of a put that may go ahead, or why it is refused before it
        touches the log (the full check, with the reasons). ``wait``: the put waits for the
        store's promise (WAIT=true), which the in-sync gate asks of it."""
        unavailable = PutMessageStatus.SERVICE_NOT_AVAILABLE
        if self.closed or not self.running:
            return self.refuse("store is closed", unavailable)
        if self.truncating:
            return self.refuse("the store is cutting its log back", unavailable)
        if self.role is BrokerRole.SLAVE:
            return self.refuse("a slave does not accept writes", unavailable)
        dispatcher = self.dispatcher
        if dispatcher.error is not None:
            return self.refuse(f"store is read-only: {dispatcher.error}", unavailable)
        if self.disk.full is not None:
            return self.refuse(self.disk.full, unavailable)
        if dispatcher.stalled is not None:
            return self.refuse(
                f"the consume queues cannot be written now ({dispatcher.stalled}); "
                "the store takes puts again once they can", unavailable)
        topic_bytes = self.topic_bytes(topic)
        if topic_bytes is None:
            return self.refuse(
                f"topic {topic!r} is not a valid topic name (1-127 of [%|a-zA-Z0-9_-])"
            )
        if not 0 <= queue_id <= layout.INT32_MAX:
            return self.refuse(f"queue id {queue_id} out of range")
        if body_len > self.config.max_message_size:
            return self.refuse(
                f"body of {body_len} bytes exceeds maxMessageSize {self.config.max_message_size}"
            )
        gate = self.in_sync_gate
        if gate is not None and wait and not gate.admits_puts:
            # RocketMQ's remark, which END_TRANSACTION answers with as it is.
            return self.refuse(IN_SYNC_REPLICAS_NOT_ENOUGH,
                               PutMessageStatus.IN_SYNC_REPLICAS_NOT_ENOUGH)
        return topic_bytes

    def refuse(self, remark: str,
               status: PutMessageStatus = PutMessageStatus.MESSAGE_ILLEGAL) -> PutMessageResult:
        """A put refused, counted."""
        self.put_failures += 1
        return PutMessageResult(status, remark=remark)

    def encoder_refused(self, code: int, topic_len: int) -> PutMessageResult:
        """A put whose record the encoder refused with error ``code``."""
        return self.refuse(_encode_error(code, topic_len), _encode_status(code))

    def topic_bytes(self, topic: str) -> bytes | None:
        """The encoded topic, or None if it is not a valid topic name (cached)."""
        encoded = self.topics.get(topic)
        if encoded is None and is_valid_topic(topic):
            encoded = topic.encode()
            if len(self.topics) < _TOPICS_CACHED:
                self.topics[topic] = encoded
        return encoded

    def born_host(self, born_host: str | None) -> bytes:
        """``born_host`` ("host:port") encoded; None: the store's own (cached)."""
        if born_host is None:
            return self.store_host
        encoded = self.born_hosts.get(born_host)
        if encoded is None:
            encoded = rec.encode_host(*rec.parse_host_port(born_host))
            if len(self.born_hosts) < _HOSTS_CACHED:
                self.born_hosts[born_host] = encoded
        return encoded


def _encode_status(code: int) -> PutMessageStatus:
    if code == _backend.ERR_PROPS_TOO_LARGE:
        return PutMessageStatus.PROPERTIES_SIZE_EXCEEDED
    if code in (_backend.ERR_BODY_TOO_LARGE, _backend.ERR_BATCH_FORMAT, _backend.ERR_NO_SPACE,
                _backend.ERR_BAD_ARGUMENT, _backend.ERR_TOO_MANY):
        return PutMessageStatus.MESSAGE_ILLEGAL
    return PutMessageStatus.UNKNOWN_ERROR


def _encode_error(code: int, topic_len: int) -> str:
    return {
        _backend.ERR_NO_SPACE: "record larger than a commitlog segment",
        _backend.ERR_BAD_ARGUMENT: f"bad record field (topic of {topic_len} bytes, host)",
        _backend.ERR_BATCH_FORMAT: "malformed batch body",
        _backend.ERR_BODY_TOO_LARGE: "a batch item's body exceeds maxMessageSize",
        _backend.ERR_PROPS_TOO_LARGE: f"properties exceed {rec.MAX_PROPERTIES_LENGTH} bytes",
        _backend.ERR_TOO_MANY: "too many items in one batch",
    }.get(code, f"encoder error {code}")
