"""Transactional messages: half messages, END_TRANSACTION and the check-back (RocketMQ 4.9).

A transactional producer sends its message with TRAN_MSG=true (and PGROUP, its group). The
broker stores it as a *half message*: in RMQ_SYS_TRANS_HALF_TOPIC queue 0, its topic and
queue kept in REAL_TOPIC and REAL_QID (``half_message``), so no consumer sees it. The
producer runs its local transaction and sends END_TRANSACTION naming the half message (its
commitlog offset and queue offset) with COMMIT or ROLLBACK:

* COMMIT stores a copy in its real topic (transaction type COMMIT, TRAN_MSG, REAL_TOPIC and
  REAL_QID removed), which consumers then read;
* either way an *op message* goes to RMQ_SYS_TRANS_OP_HALF_TOPIC: tag ``d``, body the half
  message's queue offset as text. It marks the half message done.

A producer that dies or answers UNKNOW leaves its half message undecided. ``TransactionCheck``
(masters only) looks every transactionCheckInterval at the half messages not marked done
whose producers have had transactionTimeOut (or the message's CHECK_IMMUNITY_TIME_IN_SECONDS)
to decide: it stores the half message again at the end of the half queue with
TRANSACTION_CHECK_TIMES one higher and sends CHECK_TRANSACTION_STATE, with the copy's offsets,
to a live producer of the message's group, which answers with END_TRANSACTION (from check).
A half message checked transactionCheckMax times is given up: moved to
TRANS_CHECK_MAX_TIME_TOPIC, as RocketMQ does.

How far the check got is kept as RocketMQ keeps it, as the consumer offsets of group
CID_RMQ_SYS_TRANS on the half and op queues (consumerOffset.json), so it survives restarts and
crashes and reaches the slaves with the other offsets.

A transaction is decided once (``TransactionDecisions``), where RocketMQ 4.9 commits a message
as often as END_TRANSACTION asks. The producer's own END and its answer to a check (which names
the check's copy of the half message) are two ENDs of one transaction, and a retried or
replayed END is a third: a repeat of the decision answers as the first did and delivers
nothing more; the other decision answers ILLEGAL_OPERATION (RocketMQ 5's answer to an END it
will not apply). A transaction is its producer group and its UNIQ_KEY, which the check's
copies keep. Each op message records its decision (``TRAN_DECISION``) and the transaction
(``KEYS``, so the index finds it): the decisions of the last ``MAX_REMEMBERED`` transactions
are answered from memory, older ones and those made before a restart from the index (with
messageIndexEnable=false, from memory only). A crash between a commit's copy and its op
message still makes the check ask again: that window stays at-least-once, as in RocketMQ.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import attrs
import trio

from ..ratelog import RateLimitedLog
from ..remoting import RemotingConnection
from ..store import MessageStore, PutMessageStatus, PutRequest
from ..wire import record as rec
from ..wire.metadata import TRANS_CHECK_MAX_TIME_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from ..wire.remoting import RemotingCommand, RequestCode, ResponseCode
from .clients import ClientManager
from .metadata import BrokerMetadata

__all__ = [
    "TransactionCheck", "TransactionDecisions",
    "end_transaction", "half_message", "is_transactional", "transaction_key",
]

log = logging.getLogger(__name__)

PROPERTY_TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
#: the op message's tag: the half message is done (committed or rolled back)
REMOVE_TAG = "d"
#: the op message's property naming its decision, COMMIT or ROLLBACK (ours: RocketMQ reads
#: only an op message's tag and body, so its brokers read our op queues as before)
PROPERTY_TRANSACTION_DECISION = "TRAN_DECISION"
#: transactions whose decisions are answered from memory (the index answers for older ones)
MAX_REMEMBERED = 65536
#: op messages of one transaction the index lookup reads at most (one per check's copy)
MAX_OPS_PER_TRANSACTION = 64
#: ms before a half message's birth an op message of its transaction is looked for (a
#: producer's clock may run ahead of the broker's)
CLOCK_SKEW_MS = 3_600_000
#: the group whose consumer offsets record how far the check got
CHECK_GROUP = "CID_RMQ_SYS_TRANS"
#: half and op messages read per step of a check round
CHECK_BATCH = 32
#: new op messages a round reads at most (the rest wait for the next round)
MAX_OPS_PER_ROUND = 65536

COMMIT = rec.TRANSACTION_COMMIT
ROLLBACK = rec.TRANSACTION_ROLLBACK
_DECISION_NAMES = {COMMIT: "COMMIT", ROLLBACK: "ROLLBACK"}
_DECISIONS_BY_NAME = {name: decision for decision, name in _DECISION_NAMES.items()}


def is_transactional(properties: dict[str, str]) -> bool:
    """A half message, as RocketMQ decides it: TRAN_MSG is "true" (in any case)."""
    return properties.get(rec.PROPERTY_TRANSACTION_PREPARED, "").lower() == "true"


def half_message(topic: str, queue_id: int, properties: dict[str, str]) -> dict[str, str]:
    """The properties a half message is stored with (in TRANS_HALF_TOPIC queue 0, with
    transaction type NOT_TYPE: it is dispatched to the half queue, which the check reads)."""
    moved = dict(properties)
    moved[rec.PROPERTY_REAL_TOPIC] = topic
    moved[rec.PROPERTY_REAL_QUEUE_ID] = str(queue_id)
    return moved


def transaction_key(half: rec.StoredMessage) -> str:
    """The transaction a half message belongs to: its producer group and UNIQ_KEY, which the
    check's copies keep (a half message without a UNIQ_KEY is its own transaction)."""
    group = half.properties.get(rec.PROPERTY_PRODUCER_GROUP, "")
    uniq = half.properties.get(rec.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, "")
    if not uniq or " " in uniq:
        uniq = f"@{half.commitlog_offset}"
    return f"{group}/{uniq}"


@attrs.define(eq=False)
class _Decision:
    decision: int
    #: set once the decision is stored (its commit copy and op message), or failed
    stored: trio.Event = attrs.field(factory=trio.Event)
    ok: bool = False
    #: half queue offsets (the half message and the check's copies) an op message marks done
    marked: set[int] = attrs.field(factory=set)


@attrs.define(eq=False)
class TransactionDecisions:
    """What each transaction was decided (see the module's docstring)."""

    store: MessageStore
    max_remembered: int = MAX_REMEMBERED
    #: transaction key -> its decision, oldest first
    _recent: dict[str, _Decision] = attrs.field(factory=dict)

    async def decided(self, half: rec.StoredMessage) -> _Decision | None:
        """The stored decision of ``half``'s transaction, or None: from memory, waiting for
        one being stored now, else from the op messages the index finds."""
        key = transaction_key(half)
        known = self._recent.get(key)
        if known is not None:
            await known.stored.wait()
            if known.ok:
                return known
            return None
        await trio.lowlevel.checkpoint()
        found = self._recorded(key, half)
        if found is not None:
            if key in self._recent:  # decided while we looked
                return await self.decided(half)
            self._remember(key, found)
        return found

    def _recorded(self, key: str, half: rec.StoredMessage) -> _Decision | None:
        """The decision an op message records for ``key``, found by the index."""
        begin = max(0, min(half.born_timestamp, half.store_timestamp) - CLOCK_SKEW_MS)
        found = self.store.query_message(TRANS_OP_HALF_TOPIC, key, MAX_OPS_PER_TRANSACTION,
                                         begin, 2**63 - 1)
        result: _Decision | None = None
        for record in found.records:
            op = rec.decode_record(record)
            decision = _DECISIONS_BY_NAME.get(op.properties.get(PROPERTY_TRANSACTION_DECISION, ""))
            if decision is None:
                continue
            if result is None:
                result = _Decision(decision, ok=True)
                result.stored.set()
            if op.body.isdigit():
                result.marked.add(int(op.body))
        return result

    def begin(self, half: rec.StoredMessage, decision: int) -> _Decision | None:
        """Claim ``half``'s transaction for ``decision``: None when another END claimed it
        first (then ask ``decided``). No checkpoint between the caller's ``decided`` and this,
        so two ENDs cannot both claim it."""
        key = transaction_key(half)
        if key in self._recent:
            return None
        entry = _Decision(decision)
        self._remember(key, entry)
        return entry

    def finish(self, half: rec.StoredMessage, entry: _Decision, *, took_effect: bool,
               marked: bool) -> None:
        """The claimed decision took effect (a commit's copy is stored; ``marked``: its op
        message too) or not: one that did not is forgotten, so a retry decides again."""
        entry.ok = took_effect
        if marked:
            entry.marked.add(half.queue_offset)
        if not took_effect:
            key = transaction_key(half)
            if self._recent.get(key) is entry:
                del self._recent[key]
        entry.stored.set()

    def _remember(self, key: str, entry: _Decision) -> None:
        recent = self._recent
        recent[key] = entry
        while len(recent) > self.max_remembered:
            oldest = next(iter(recent))
            if not recent[oldest].stored.is_set():
                break  # still being stored: kept (only max_remembered claims can be pending)
            del recent[oldest]


async def _put_op(store: MessageStore, half: rec.StoredMessage, decision: int) -> bool:
    """Mark ``half`` done: an op message naming its queue offset, its transaction (KEYS, for
    the index) and the decision."""
    properties = {rec.PROPERTY_TAGS: REMOVE_TAG, rec.PROPERTY_WAIT_STORE_MSG_OK: "false",
                  rec.PROPERTY_KEYS: transaction_key(half),
                  PROPERTY_TRANSACTION_DECISION: _DECISION_NAMES[decision]}
    result = await store.put(PutRequest(
        TRANS_OP_HALF_TOPIC, half.queue_id, str(half.queue_offset).encode(),
        rec.encode_properties(properties).encode(), wait_store_msg_ok=False,
    ))
    return result.status is PutMessageStatus.PUT_OK


async def end_transaction(store: MessageStore, request: RemotingCommand,
                          decisions: TransactionDecisions) -> RemotingCommand:
    """END_TRANSACTION: commit or roll back the half message the request names (RocketMQ
    4.9.8's EndTransactionProcessor, after the slave check), once per transaction. UNKNOW
    (0) changes nothing."""
    decision = request.field_int("commitOrRollback")
    offset = request.field_long("commitLogOffset")
    group = request.field_str("producerGroup")
    table_offset = request.field_long("tranStateTableOffset")
    if decision not in (COMMIT, ROLLBACK):
        await trio.lowlevel.checkpoint()
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)
    half = await store.look_message_by_offset(offset)
    problem = None
    if half is None or half.topic != TRANS_HALF_TOPIC:
        problem = "Find prepared transaction message failed"
    elif half.properties.get(rec.PROPERTY_PRODUCER_GROUP) != group:
        problem = "The producer group wrong"
    elif half.queue_offset != table_offset:
        problem = "The transaction state table offset wrong"
    if problem is not None or half is None:
        return RemotingCommand.response_to(request, ResponseCode.SYSTEM_ERROR, remark=problem)
    for _ in range(3):  # a claim that fails while we wait is tried again, a few times
        earlier = await decisions.decided(half)
        if earlier is not None:
            return await _answer_decided(store, request, half, decision, earlier)
        entry = decisions.begin(half, decision)
        if entry is not None:
            break
    else:
        return RemotingCommand.response_to(request, ResponseCode.SYSTEM_BUSY,
                                           remark="the transaction is being decided; retry")
    outcome = _Outcome()
    try:
        return await _decide(store, request, half, decision, outcome)
    finally:
        decisions.finish(half, entry, took_effect=outcome.took_effect, marked=outcome.marked)


async def _answer_decided(store: MessageStore, request: RemotingCommand,
                          half: rec.StoredMessage, decision: int,
                          earlier: _Decision) -> RemotingCommand:
    """An END of a transaction already decided: nothing is delivered again; the half message
    it names (a check's copy, say) is marked done if no op message marks it yet."""
    if half.queue_offset not in earlier.marked:
        if not await _put_op(store, half, earlier.decision):
            return RemotingCommand.response_to(
                request, ResponseCode.SYSTEM_ERROR,
                remark="cannot store the transaction's op message")
        earlier.marked.add(half.queue_offset)
    else:
        await trio.lowlevel.checkpoint()
    if decision == earlier.decision:
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)
    return RemotingCommand.response_to(
        request, ResponseCode.ILLEGAL_OPERATION,
        remark=f"the transaction was already decided: {_DECISION_NAMES[earlier.decision]}")


@attrs.define
class _Outcome:
    #: a commit's copy is stored (or it is a rollback, which delivers nothing)
    took_effect: bool = False
    #: the op message is stored
    marked: bool = False


async def _decide(store: MessageStore, request: RemotingCommand, half: rec.StoredMessage,
                  decision: int, outcome: _Outcome) -> RemotingCommand:
    """Store the decision: the commit's copy in the real topic, then the op message. A
    commit whose op message fails stays decided (its copy is delivered): a retry only marks
    the half message done."""
    if decision == COMMIT:
        properties = dict(half.properties)
        for name in (rec.PROPERTY_TRANSACTION_PREPARED, rec.PROPERTY_REAL_TOPIC,
                     rec.PROPERTY_REAL_QUEUE_ID):
            properties.pop(name, None)
        properties[rec.PROPERTY_WAIT_STORE_MSG_OK] = "false"
        real_queue = half.properties.get(rec.PROPERTY_REAL_QUEUE_ID, "")
        real_topic = half.properties.get(rec.PROPERTY_REAL_TOPIC, "")
        if not real_topic or not real_queue.isdigit():
            return RemotingCommand.response_to(
                request, ResponseCode.SYSTEM_ERROR,
                remark="the half message names no real topic and queue")
        result = await store.put(PutRequest(
            real_topic, int(real_queue), half.body, rec.encode_properties(properties).encode(),
            flag=half.flag, sys_flag=(half.sys_flag & ~rec.TRANSACTION_TYPE_MASK) | COMMIT,
            born_timestamp=half.born_timestamp, born_host=half.born_host,
            reconsume_times=half.reconsume_times, prepared_transaction_offset=half.commitlog_offset,
            wait_store_msg_ok=False,
        ))
        if result.status is not PutMessageStatus.PUT_OK:
            return RemotingCommand.response_to(request, ResponseCode.SYSTEM_ERROR,
                                               remark=result.remark or result.status.name)
        outcome.took_effect = True
    if not await _put_op(store, half, decision):
        return RemotingCommand.response_to(request, ResponseCode.SYSTEM_ERROR,
                                           remark="cannot store the transaction's op message")
    outcome.took_effect = outcome.marked = True
    return RemotingCommand.response_to(request, ResponseCode.SUCCESS)


@attrs.frozen
class TransactionCheckStatistics:
    #: check rounds run, CHECK_TRANSACTION_STATE requests sent, half messages given up
    rounds: int
    checks_sent: int
    discarded: int
    #: half messages that needed a check and had no live producer of their group
    no_producer: int


@attrs.define(eq=False)
class TransactionCheck:
    """The master's check of undecided half messages. ``run`` is its task."""

    store: MessageStore
    metadata: BrokerMetadata
    clients: ClientManager
    #: ms: how often a round runs, how old a half message must be, how many checks at most
    interval: int
    timeout: int
    check_max: int
    #: called after this service made a topic (the broker registers it again)
    topics_changed: Callable[[], None] = lambda: None
    _rounds: int = 0
    _checks_sent: int = 0
    _discarded: int = 0
    _no_producer: int = 0
    _opaques: int = 0
    #: op queue offset -> the half queue offset it marks done, from op_offset on
    _op_marks: dict[int, int] = attrs.field(factory=dict)
    #: the op queue is read up to here
    _op_read_to: int = 0
    _log: RateLimitedLog = attrs.field(factory=lambda: RateLimitedLog(log))
    #: what each transaction was decided (END_TRANSACTION's and this check's)
    decisions: TransactionDecisions = attrs.field(
        default=attrs.Factory(lambda self: TransactionDecisions(self.store), takes_self=True))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        task_status.started()
        while True:
            await trio.sleep(self.interval / 1000)
            await self.check_once()

    def statistics(self) -> TransactionCheckStatistics:
        return TransactionCheckStatistics(self._rounds, self._checks_sent, self._discarded,
                                          self._no_producer)

    def _offset(self, topic: str) -> int:
        committed = self.metadata.offsets.query(CHECK_GROUP, topic, 0)
        low = self.store.min_queue_offset(topic, 0)
        return low if committed is None else max(committed, low)

    async def _read_ops(self, op_offset: int) -> bool:
        """Bring ``_op_marks`` (op queue offset -> the half queue offset it marks done) up to
        the op queue's end, reading at most MAX_OPS_PER_ROUND new op messages: what earlier
        rounds read is kept, so a half message left undecided for long (which holds the op
        offset back) does not make every round read every op since. True when it reached
        the end."""
        store = self.store
        marks = self._op_marks
        for old in [k for k in marks if k < op_offset]:
            del marks[old]
        offset = max(op_offset, self._op_read_to)
        end = store.max_queue_offset(TRANS_OP_HALF_TOPIC, 0)
        budget = MAX_OPS_PER_ROUND
        while offset < end and budget > 0:
            entries = store.queue_entries(TRANS_OP_HALF_TOPIC, 0, offset,
                                          min(CHECK_BATCH, budget))
            if not entries:
                break
            for entry in entries:
                record = store.record_bytes(entry.commitlog_offset)
                body = rec.decode_record(record).body if record is not None else b""
                marks[offset] = int(body) if body.isdigit() else -1
                offset += 1
            budget -= len(entries)
            await trio.lowlevel.checkpoint()
        self._op_read_to = offset
        return offset >= end

    async def check_once(self) -> None:
        """One round (RocketMQ's TransactionalMessageServiceImpl.check, for queue 0): walk
        the half queue from where the last round stopped, skip what an op message marks done,
        check what is old enough, stop at the first that is not."""
        await trio.lowlevel.checkpoint()
        self._rounds += 1
        store = self.store
        half_offset = self._offset(TRANS_HALF_TOPIC)
        op_offset = self._offset(TRANS_OP_HALF_TOPIC)
        complete = await self._read_ops(op_offset)
        done = set(self._op_marks.values())
        end = store.max_queue_offset(TRANS_HALF_TOPIC, 0)
        now = time.time_ns() // 1_000_000
        stop = False
        while half_offset < end and not stop:
            entries = store.queue_entries(TRANS_HALF_TOPIC, 0, half_offset, CHECK_BATCH)
            if not entries:
                break
            for entry in entries:
                if half_offset in done:
                    half_offset += 1
                    continue
                if not complete:
                    # Its op message may be among those not read yet: ask nobody this
                    # round (a needless check could deliver a commit twice).
                    stop = True
                    break
                half = await store.look_message_by_offset(entry.commitlog_offset)
                if half is None:  # removed by retention: nothing left to decide
                    half_offset += 1
                    continue
                checks = int(half.properties.get(PROPERTY_TRANSACTION_CHECK_TIMES, "0") or 0)
                if checks >= self.check_max:
                    await self._discard(half)
                    half_offset += 1
                    continue
                immunity = self.timeout
                immune_text = half.properties.get(PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS, "")
                if immune_text.isdigit():
                    immunity = int(immune_text) * 1000
                if await self._decided_already(half):
                    half_offset += 1
                    continue
                if now - half.born_timestamp < immunity or not await self._check(half, checks + 1):
                    # Too young, and so is every later one; or the copy could not be stored
                    # (tried again next round).
                    stop = True
                    break
                half_offset += 1
            await trio.lowlevel.checkpoint()
        # The op messages whose half messages are all behind us are done with.
        marks = self._op_marks
        while op_offset in marks and marks[op_offset] < half_offset:
            op_offset += 1
        offsets = self.metadata.offsets
        offsets.commit(CHECK_GROUP, TRANS_HALF_TOPIC, 0, half_offset)
        offsets.commit(CHECK_GROUP, TRANS_OP_HALF_TOPIC, 0, op_offset)

    async def _decided_already(self, half: rec.StoredMessage) -> bool:
        """Whether ``half``'s transaction was decided through another of its half messages
        (the producer's END for the original, a check's copy answered): then this one is
        marked done instead of asked about again."""
        earlier = await self.decisions.decided(half)
        if earlier is None:
            return False
        if half.queue_offset not in earlier.marked and await _put_op(self.store, half,
                                                                     earlier.decision):
            earlier.marked.add(half.queue_offset)
        return True

    async def _check(self, half: rec.StoredMessage, checks: int) -> bool:
        """Store ``half`` again at the end of the half queue with its check count, and ask a
        producer of its group about the copy. False when the copy could not be stored."""
        properties = dict(half.properties)
        properties[PROPERTY_TRANSACTION_CHECK_TIMES] = str(checks)
        result = await self.store.put(PutRequest(
            TRANS_HALF_TOPIC, 0, half.body, rec.encode_properties(properties).encode(),
            flag=half.flag, sys_flag=half.sys_flag, born_timestamp=half.born_timestamp,
            born_host=half.born_host, reconsume_times=half.reconsume_times,
            wait_store_msg_ok=False,
        ))
        if result.status is not PutMessageStatus.PUT_OK:
            self._log.log(logging.WARNING, "copy", "transactions: cannot store a half message "
                          "again for its check (%s)", result.status.name)
            return False
        group = properties.get(rec.PROPERTY_PRODUCER_GROUP, "")
        connection = self.clients.producer_connection(group)
        if connection is None:
            self._no_producer += 1
            self._log.log(logging.INFO, ("no producer", group), "transactions: no live "
                          "producer of group %s to check a half message with", group)
            return True
        copy = await self.store.look_message_by_offset(result.commitlog_offset)
        if copy is None:
            return True
        self._send_check(connection, copy)
        return True

    def _send_check(self, connection: RemotingConnection, half: rec.StoredMessage) -> None:
        uniq = half.properties.get(rec.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, "")
        fields = {"tranStateTableOffset": half.queue_offset,
                  "commitLogOffset": half.commitlog_offset, "msgId": uniq,
                  "transactionId": uniq, "offsetMsgId": half.msg_id}
        # The body is the message as its producer sent it: real topic and queue, as
        # RocketMQ's Broker2Client encodes it.
        body = rec.encode_record(
            topic=half.properties.get(rec.PROPERTY_REAL_TOPIC, half.topic).encode(),
            body=half.body, properties=rec.encode_properties(half.properties).encode(),
            queue_id=int(half.properties.get(rec.PROPERTY_REAL_QUEUE_ID, "0") or 0),
            flag=half.flag, queue_offset=half.queue_offset,
            commitlog_offset=half.commitlog_offset, sys_flag=half.sys_flag,
            born_timestamp=half.born_timestamp,
            born_host=rec.encode_host(*rec.parse_host_port(half.born_host)),
            store_timestamp=half.store_timestamp,
            store_host=rec.encode_host(*rec.parse_host_port(half.store_host)),
            reconsume_times=half.reconsume_times,
            prepared_transaction_offset=half.prepared_transaction_offset,
        )
        self._opaques += 1
        try:
            connection.send_nowait(RemotingCommand.request(
                RequestCode.CHECK_TRANSACTION_STATE, fields, body=body, oneway=True,
                opaque=self._opaques))
        except Exception as exc:  # a connection closing under us: the next round asks again
            log.info("transactions: sending a check to %s failed: %s", connection.peer, exc)
            return
        self._checks_sent += 1

    async def _discard(self, half: rec.StoredMessage) -> None:
        """Checked transactionCheckMax times: given up, kept in TRANS_CHECK_MAX_TIME_TOPIC."""
        self._discarded += 1
        topics = self.metadata.topics
        if topics.get(TRANS_CHECK_MAX_TIME_TOPIC) is None:
            topics.create_topic_in_send_back(TRANS_CHECK_MAX_TIME_TOPIC, 1)
            self.topics_changed()
        log.warning("transactions: half message %s of group %s checked %d times without an "
                    "answer; moved to %s", half.msg_id,
                    half.properties.get(rec.PROPERTY_PRODUCER_GROUP), self.check_max,
                    TRANS_CHECK_MAX_TIME_TOPIC)
        await self.store.put(PutRequest(
            TRANS_CHECK_MAX_TIME_TOPIC, 0, half.body,
            rec.encode_properties(half.properties).encode(), flag=half.flag,
            sys_flag=half.sys_flag, born_timestamp=half.born_timestamp,
            born_host=half.born_host, wait_store_msg_ok=False,
        ))
