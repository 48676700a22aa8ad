"""Delayed messages: moved aside when sent, delivered to their topic when due (delay levels).

A message sent with the DELAY property (a level, 1 to the number of ``messageDelayLevel``
entries; higher counts as the highest) is not stored in its topic. The broker stores it in
SCHEDULE_TOPIC_XXXX, queue level - 1, with its topic and queue kept in REAL_TOPIC and
REAL_QID (``delayed``), and the dispatcher writes the time it is due — store time plus the
level's delay — into its consume-queue entry. So each level's queue is in due order: its
messages all wait the same delay, in the order they were stored.

``ScheduleService`` delivers them on a master: one task per level walks its queue from the
level's offset in ``delayOffset.json``, sleeps until the entry in front is due, and puts a
copy of the message into its real topic (DELAY removed, not waiting for disk or slaves, as
RocketMQ's ``messageTimeup`` does); then the level's offset moves past it. The broker writes
the offsets with its other metadata (every flushConsumerOffsetInterval and at shutdown), so a
crash loses no due message: a restarted master delivers again from the last written offset,
and a message may arrive twice, within at-least-once. A slave never delivers; it copies its
master's offsets (``slave_sync``), so that once it is made a master it goes on from there.

What differs from RocketMQ's ScheduleMessageService (4.9):

* It waits, rather than polls: a level with nothing in its queue waits for the queue to grow,
  and an entry not due yet is slept on until it is due. RocketMQ looks at every level every
  100 ms.
* Its clock is the wall clock the store stamps records with; an entry due further away than
  its level's delay (the clock went back) is taken as due now, as RocketMQ's
  ``correctDeliverTimestamp`` does.
* A failed put is tried again after ``RETRY_DELAY`` (a full disk: RocketMQ waits 100 ms);
  the level does not move past a message that was not delivered.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import attrs
import trio

from ..ratelog import RateLimitedLog
from ..store import MessageStore, PutMessageStatus, PutRequest
from ..wire import record as rec
from ..wire.metadata import SCHEDULE_TOPIC, TRANS_HALF_TOPIC
from .metadata import DelayOffsetManager

__all__ = ["DelayedMessage", "ScheduleService", "ScheduleStatistics", "delayed"]

log = logging.getLogger(__name__)

#: how long a level waits before its first look (RocketMQ's FIRST_DELAY_TIME)
FIRST_DELAY = 1.0
#: after a put that failed, how long before the level tries the message again
RETRY_DELAY = 1.0
#: consume-queue entries a level reads at a time
ENTRY_BATCH = 32


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@attrs.frozen
class DelayedMessage:
    """Where a message with a delay level is stored instead of its own topic."""

    topic: str
    queue_id: int
    #: its properties with REAL_TOPIC and REAL_QID added
    properties: dict[str, str]


def delay_level(properties: dict[str, str]) -> int | None:
    """The DELAY property as a level: None when absent or 0 (no delay); ValueError when it is
    not a number (RocketMQ's client writes a decimal integer)."""
    text = properties.get(rec.PROPERTY_DELAY_TIME_LEVEL)
    if text is None or text == "":
        return None
    level = int(text.strip())
    return level if level > 0 else None


def delayed(topic: str, queue_id: int, properties: dict[str, str], level: int,
            levels: int) -> DelayedMessage:
    """A message of (topic, queue_id) with delay ``level`` as the store keeps it until due
    (RocketMQ's CommitLog.putMessage, 4.9): a level above ``levels`` counts as ``levels``."""
    level = min(level, levels)
    moved = dict(properties)
    moved[rec.PROPERTY_DELAY_TIME_LEVEL] = str(level)
    moved[rec.PROPERTY_REAL_TOPIC] = topic
    moved[rec.PROPERTY_REAL_QUEUE_ID] = str(queue_id)
    return DelayedMessage(SCHEDULE_TOPIC, level - 1, moved)


@attrs.frozen
class ScheduleStatistics:
    #: level -> (next queue offset to deliver, the level queue's max offset)
    levels: dict[int, tuple[int, int]]
    #: messages put back into their topics since the start
    delivered: int
    #: due messages whose record was gone (retention) or held no real topic: skipped
    skipped: int
    #: puts into the real topic that failed (each is tried again)
    failed: int


@attrs.define(eq=False)
class ScheduleService:
    """Delivers due delayed messages of ``store`` and keeps each level's progress in
    ``offsets``. ``run`` is its task (on a master only)."""

    store: MessageStore
    offsets: DelayOffsetManager
    #: milliseconds per level (level n at index n - 1)
    delay_levels: tuple[int, ...]
    #: milliseconds since the epoch, the clock records are stamped with
    now_ms: Callable[[], int] = wall_clock_ms
    _delivered: int = 0
    _skipped: int = 0
    _failed: int = 0
    _log: RateLimitedLog = attrs.field(factory=lambda: RateLimitedLog(log))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        async with trio.open_nursery() as nursery:
            for level in range(1, len(self.delay_levels) + 1):
                nursery.start_soon(self._deliver_level, level)
            task_status.started()

    def statistics(self) -> ScheduleStatistics:
        store = self.store
        levels = {
            level: (self._offset(level), store.max_queue_offset(SCHEDULE_TOPIC, level - 1))
            for level in range(1, len(self.delay_levels) + 1)
        }
        return ScheduleStatistics(levels, self._delivered, self._skipped, self._failed)

    def _offset(self, level: int) -> int:
        """The level's next offset, moved into its queue's range (RocketMQ's
        ``correctDelayOffset``: retention may have removed what it had not delivered yet; a
        table copied from elsewhere may point past the end)."""
        queue_id = level - 1
        offset = self.offsets.get(level) or 0
        low = self.store.min_queue_offset(SCHEDULE_TOPIC, queue_id)
        high = self.store.max_queue_offset(SCHEDULE_TOPIC, queue_id)
        corrected = min(max(offset, low), high)
        if corrected != offset:
            log.warning("schedule: delay level %d offset %d is outside its queue [%d, %d]; "
                        "going on from %d", level, offset, low, high, corrected)
            self.offsets.update(level, corrected)
        return corrected

    async def _deliver_level(self, level: int) -> None:
        queue_id = level - 1
        delay = self.delay_levels[level - 1]
        store = self.store
        await trio.sleep(FIRST_DELAY)
        while True:
            offset = self._offset(level)
            entries = store.queue_entries(SCHEDULE_TOPIC, queue_id, offset, ENTRY_BATCH)
            if not entries:
                await store.queue_arrivals(SCHEDULE_TOPIC, queue_id).wait_for(offset + 1)
                continue
            for entry in entries:
                now = self.now_ms()
                due = entry.tags_code
                if due > now + delay:
                    due = now  # the clock went back: due now, as RocketMQ corrects it
                if due > now:
                    await trio.sleep((due - now) / 1000)
                    break  # read the entries again: the queue may have been cut meanwhile
                if not await self._deliver(level, entry.commitlog_offset):
                    await trio.sleep(RETRY_DELAY)
                    break
                offset += 1
                self.offsets.update(level, offset)

    async def _deliver(self, level: int, commitlog_offset: int) -> bool:
        """Put the delayed message at ``commitlog_offset`` into its real topic. True once it
        needs no more work (delivered, or skipped because it cannot be)."""
        message = await self.store.look_message_by_offset(commitlog_offset)
        real_topic = None if message is None else message.properties.get(rec.PROPERTY_REAL_TOPIC)
        real_queue = "" if message is None else message.properties.get(
            rec.PROPERTY_REAL_QUEUE_ID, "")
        if message is None or not real_topic or not real_queue.isdigit() \
                or real_topic == TRANS_HALF_TOPIC:
            # RocketMQ skips these too: nothing could ever deliver them.
            self._skipped += 1
            self._log.log(
                logging.WARNING, "skip", "schedule: delay level %d: no deliverable message at "
                "commitlog offset %d (removed, or without a real topic); skipped", level,
                commitlog_offset,
            )
            return True
        properties = dict(message.properties)
        properties.pop(rec.PROPERTY_DELAY_TIME_LEVEL, None)
        properties[rec.PROPERTY_WAIT_STORE_MSG_OK] = "false"
        result = await self.store.put(PutRequest(
            real_topic, int(real_queue), message.body,
            rec.encode_properties(properties).encode(), flag=message.flag,
            sys_flag=message.sys_flag, born_timestamp=message.born_timestamp,
            born_host=message.born_host, reconsume_times=message.reconsume_times,
            wait_store_msg_ok=False,
        ))
        if result.status is PutMessageStatus.PUT_OK:
            self._delivered += 1
            return True
        self._failed += 1
        self._log.log(
            logging.WARNING, "put", "schedule: delay level %d: delivering the message at "
            "commitlog offset %d to %s failed (%s); trying again in %g s", level,
            commitlog_offset, real_topic,
            result.status.name, RETRY_DELAY,
        )
        return False
