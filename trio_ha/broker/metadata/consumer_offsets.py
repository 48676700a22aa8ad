"""``consumerOffset.json``: how far each consumer group has consumed each queue.

RocketMQ's ConsumerOffsetManager: ``"<topic>@<group>"`` -> queue id -> the next offset the
group will consume. Consumers commit through UPDATE_CONSUMER_OFFSET and with their pulls; the
broker writes the table every ``flushConsumerOffsetInterval``. A slave copies its master's
table, merging **monotonically** per queue, so a master that restarted with older offsets
cannot drag the slave's newer ones back (RocketMQ issue #1094, where ``putAll`` did exactly
that and consumers saw duplicates).

While the master is down, consumers commit to the slave instead. Those commits are remembered
apart (``commit_on_slave``) until the master holds them or something newer: the slave's sync
hands each one that is still ahead of the master's offset over to it (``handover``), so that a
returning master does not give the group the same messages again. Only these are handed over,
never offsets the slave merely copied from the master: an operator's reset on the master moves
its offsets back on purpose, and copies of the old ones must not undo it.

Every client may commit, so the table has a cap (``maxConsumerOffsetNums``, queue offsets in
all, which RocketMQ lacks): a commit that would add an offset beyond it is refused, while the
offsets already held keep moving. What a commit may name at all — a topic and a group the
broker has — is the request processor's check.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import ClassVar

import attrs

from trio_ha.wire.metadata import (
    CONSUMER_OFFSET_JSON,
    ConsumerOffsetTable,
    DataVersion,
    decode_consumer_offsets,
    encode_consumer_offsets,
    offset_key,
    split_offset_key,
)

from .config_file import ConfigFile
from .files import load_with_backup
from .validation import (
    MetadataLimitError,
    check_group,
    check_offset,
    check_queue_id,
    check_topic,
)

__all__ = ["DEFAULT_MAX_CONSUMER_OFFSETS", "ConsumerOffsetManager"]

#: ``maxConsumerOffsetNums``' default: 1000 groups each reading 100 queues, several times over;
#: about 100 bytes of memory and 20 of JSON each
DEFAULT_MAX_CONSUMER_OFFSETS = 500_000

log = logging.getLogger(__name__)


def _group_of(key: str) -> str | None:
    """The group of a ``<topic>@<group>`` key; None for a key of any other shape."""
    try:
        return split_offset_key(key)[1]
    except ValueError:
        return None


def _topic_of(key: str) -> str | None:
    """The topic of a ``<topic>@<group>`` key; None for a key of any other shape."""
    try:
        return split_offset_key(key)[0]
    except ValueError:
        return None


@attrs.define(eq=False)
class ConsumerOffsetManager(ConfigFile[ConsumerOffsetTable]):
    """``consumerOffset.json``. ``commit`` takes whatever the consumer says (it may move back:
    an offset reset); only ``merge_from_master`` is monotonic. ``max_offsets`` is
    ``maxConsumerOffsetNums``."""

    file_name: ClassVar[str] = CONSUMER_OFFSET_JSON

    _table: dict[str, dict[int, int]] = attrs.field(factory=dict)
    #: 5.x's DataVersion, kept when loaded or adopted from the master; None (not written) as 4.9
    _version: DataVersion | None = None
    max_offsets: int = attrs.field(default=DEFAULT_MAX_CONSUMER_OFFSETS, kw_only=True)
    #: queue offsets in the table, kept as it changes (a commit must not count them all)
    _count: int = attrs.field(init=False)
    _full_logged: bool = attrs.field(default=False, init=False)
    #: offsets consumers committed here while this broker was a slave, not yet known to be held
    #: by the master: ``<topic>@<group>`` -> queue id -> offset. In memory only (a slave that
    #: restarts before its master returns keeps the offsets, but no longer hands them over).
    #: Each is also in the table, so the table's cap bounds it.
    _for_master: dict[str, dict[int, int]] = attrs.field(factory=dict, init=False)

    def __attrs_post_init__(self) -> None:
        self._count = sum(len(queues) for queues in self._table.values())

    @classmethod
    def load(
        cls, config_dir: str | os.PathLike[str], *,
        max_offsets: int = DEFAULT_MAX_CONSUMER_OFFSETS,
    ) -> ConsumerOffsetManager:
        """Read ``<config_dir>/consumerOffset.json`` (or its backup); an empty table when there
        is none. Blocking. Raises ``MetadataLoadError`` if both copies are damaged. A file
        with more offsets than ``max_offsets`` loads whole; no new ones are added to it."""
        path = os.path.join(os.fspath(config_dir), cls.file_name)
        loaded = load_with_backup(path, decode_consumer_offsets)
        if loaded is None:
            return cls(path, max_offsets=max_offsets)
        table = {key: dict(queues) for key, queues in loaded.offset_table.items()}
        return cls(path, table, loaded.data_version, max_offsets=max_offsets)

    @property
    def count(self) -> int:
        """Queue offsets in the table."""
        return self._count

    @property
    def data_version(self) -> DataVersion | None:
        """5.x's DataVersion of the table, kept when loaded or adopted from the master; None
        (and not written) otherwise, as 4.9."""
        return self._version

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """UPDATE_CONSUMER_OFFSET / a pull's commit offset. Raises ``InvalidMetadataError``
        for an invalid group, topic, queue id or a negative offset, ``MetadataLimitError``
        for a new queue offset when the table holds ``max_offsets``."""
        check_group(group)
        check_topic(topic)
        check_queue_id(queue_id)
        check_offset(offset)
        key = offset_key(topic, group)
        queues = self._table.get(key)
        if queues is None or queue_id not in queues:
            self._check_room(key)
            queues = self._table.setdefault(key, {})
            self._count += 1
        if queues.get(queue_id) != offset:
            queues[queue_id] = offset
            self._dirty = True

    def commit_on_slave(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """A consumer's commit to a slave (its master is away, or the consumer thinks so):
        taken as ``commit`` takes it, and kept for the master (see ``handover``). Raises as
        ``commit``."""
        self.commit(group, topic, queue_id, offset)
        self._for_master.setdefault(offset_key(topic, group), {})[queue_id] = offset

    def handover(self, master: ConsumerOffsetTable,
                 queue_max: Callable[[str, int], int] | None = None) -> list[tuple[str, int, int]]:
        """The offsets committed on this slave that ``master`` (its table, just fetched) lacks
        or holds older: ``(<topic>@<group>, queue id, offset)`` to send it. Each is capped at
        ``queue_max(topic, queue id)`` (this slave's queue end; its log is a prefix of the
        master's), so nothing is handed over past what the queue holds. The ones the master
        already holds, or passed, are forgotten here."""
        out = []
        for key, queues in list(self._for_master.items()):
            held = master.offset_table.get(key, {})
            for queue_id, offset in list(queues.items()):
                if queue_max is not None:
                    offset = min(offset, queue_max(split_offset_key(key)[0], queue_id))
                theirs = held.get(queue_id)
                if theirs is not None and theirs >= offset:
                    del queues[queue_id]
                else:
                    out.append((key, queue_id, offset))
            if not queues:
                del self._for_master[key]
        return out

    def handed_over(self, key: str, queue_id: int, offset: int) -> None:
        """The master took ``offset`` for the queue (or refused it for good): stop handing it
        over, unless a consumer committed again here in the meantime."""
        queues = self._for_master.get(key)
        if queues is None or queue_id not in queues or queues[queue_id] > offset:
            return
        del queues[queue_id]
        if not queues:
            del self._for_master[key]

    def forget_for_master(self, key: str, queue_id: int) -> None:
        """Stop handing the queue's offset over, whatever it is (the master cannot take it)."""
        queues = self._for_master.get(key)
        if queues is not None:
            queues.pop(queue_id, None)
            if not queues:
                del self._for_master[key]

    @property
    def waiting_for_master(self) -> int:
        """Queue offsets committed here that the master is not yet known to hold."""
        return sum(len(queues) for queues in self._for_master.values())

    def _check_room(self, key: str) -> None:
        full = self._count >= self.max_offsets
        if full and not self._full_logged:
            log.warning("consumer offsets: the table holds maxConsumerOffsetNums=%d offsets; "
                        "commits of new ones are refused", self.max_offsets)
        self._full_logged = full
        if full:
            raise MetadataLimitError(
                f"offset of {key} not stored: the broker holds maxConsumerOffsetNums="
                f"{self.max_offsets} consumer offsets"
            )

    def query(self, group: str, topic: str, queue_id: int) -> int | None:
        """QUERY_CONSUMER_OFFSET: the committed offset, or None when the group never committed
        one for this queue (the processor then decides between 0 and QUERY_NOT_FOUND)."""
        queues = self._table.get(offset_key(topic, group))
        return None if queues is None else queues.get(queue_id)

    def offsets_of_group(self, group: str) -> dict[str, dict[int, int]]:
        """Every topic the group committed offsets for: topic -> queue id -> offset (copies)."""
        out = {}
        for key, queues in self._table.items():
            if _group_of(key) == group:
                out[split_offset_key(key)[0]] = dict(queues)
        return out

    def groups_of_topic(self, topic: str) -> list[str]:
        """The groups with an offset for ``topic``."""
        return [group for group_topic, group in map(split_offset_key, self._table)
                if group_topic == topic]

    def remove_group(self, group: str) -> int:
        """Forget every offset of ``group`` (deleting a subscription group with offsets);
        returns how many topics were removed."""
        keys = [key for key in self._table if _group_of(key) == group]
        for key in keys:
            self._count -= len(self._table.pop(key))
            self._for_master.pop(key, None)
        if keys:
            self._dirty = True
        return len(keys)

    def remove_topic(self, topic: str) -> int:
        """Forget every group's offsets of ``topic`` (DELETE_TOPIC_IN_BROKER, as RocketMQ 5's
        ``cleanOffsetByTopic``); returns how many groups had some."""
        keys = [key for key in self._table if _topic_of(key) == topic]
        for key in keys:
            self._count -= len(self._table.pop(key))
            self._for_master.pop(key, None)
        if keys:
            self._dirty = True
        return len(keys)

    def table(self) -> ConsumerOffsetTable:
        """A copy of the whole table: ``consumerOffset.json`` and the GET_ALL_CONSUMER_OFFSET
        body."""
        return self.snapshot()

    def merge_from_master(self, table: ConsumerOffsetTable) -> int:
        """Slave sync (GET_ALL_CONSUMER_OFFSET). Like RocketMQ's ``putAll`` it adds what the
        master has and keeps what only we have, but per queue it never moves an offset
        backwards: after a master restart its offsets may be older than ours (consumers
        committed to this slave meanwhile), and taking them would re-deliver messages
        (RocketMQ #1094). Keys that are not ``<topic>@<group>`` and negative offsets are
        ignored. Adopts the master's DataVersion when it has one (5.x). Returns the number of
        queue offsets that were added or advanced."""
        changed = 0
        for key, queues in table.offset_table.items():
            if _group_of(key) is None:
                log.warning("ignoring offset table key %r from the master", key)
                continue
            mine = self._table.get(key)
            for queue_id, offset in queues.items():
                if offset < 0 or queue_id < 0:
                    continue
                if mine is None:
                    mine = self._table[key] = {}
                current = mine.get(queue_id)
                if current is None:
                    self._count += 1
                if current is None or offset > current:
                    mine[queue_id] = offset
                    changed += 1
        if table.data_version is not None and table.data_version != self._version:
            self._version = table.data_version
            self._dirty = True
        if changed:
            self._dirty = True
        return changed

    def snapshot(self) -> ConsumerOffsetTable:
        return ConsumerOffsetTable(
            {key: dict(queues) for key, queues in self._table.items()}, self._version
        )

    @staticmethod
    def encode_snapshot(snapshot: ConsumerOffsetTable) -> bytes:
        return encode_consumer_offsets(snapshot)
