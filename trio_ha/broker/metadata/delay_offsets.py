"""``delayOffset.json``: the schedule service's progress through each delay level.

RocketMQ's ScheduleMessageService keeps, per delay level, how far it has delivered
SCHEDULE_TOPIC_XXXX's queue (level - 1): the next queue offset the master's schedule service
(``trio_ha.broker.schedule``) delivers. A RocketMQ file round-trips, and a slave mirrors its
master's.
"""

from __future__ import annotations

import os
from typing import ClassVar

import attrs

from trio_ha.wire.layout import INT32_MAX
from trio_ha.wire.metadata import (
    DELAY_OFFSET_JSON,
    DataVersion,
    DelayOffsetTable,
    decode_delay_offsets,
    encode_delay_offsets,
)

from .config_file import ConfigFile
from .files import load_with_backup
from .validation import InvalidMetadataError, check_offset

__all__ = ["DelayOffsetManager"]


@attrs.define(eq=False)
class DelayOffsetManager(ConfigFile[DelayOffsetTable]):
    """``delayOffset.json``: delay level -> progress in SCHEDULE_TOPIC_XXXX's queue."""

    file_name: ClassVar[str] = DELAY_OFFSET_JSON

    _table: dict[int, int] = attrs.field(factory=dict)
    _version: DataVersion | None = None

    @classmethod
    def load(cls, config_dir: str | os.PathLike[str]) -> DelayOffsetManager:
        """Read ``<config_dir>/delayOffset.json`` (or its backup); an empty table when there is
        none. Blocking. Raises ``MetadataLoadError`` if both copies are damaged."""
        path = os.path.join(os.fspath(config_dir), cls.file_name)
        loaded = load_with_backup(path, decode_delay_offsets)
        if loaded is None:
            return cls(path)
        return cls(path, dict(loaded.offset_table), loaded.data_version)

    def get(self, level: int) -> int | None:
        return self._table.get(level)

    def update(self, level: int, offset: int) -> None:
        if type(level) is not int or not 1 <= level <= INT32_MAX:
            raise InvalidMetadataError(f"delay level must be a positive integer, got {level!r}")
        check_offset(offset)
        if self._table.get(level) != offset:
            self._table[level] = offset
            self._dirty = True

    def table(self) -> DelayOffsetTable:
        """A copy: ``delayOffset.json`` and the GET_ALL_DELAY_OFFSET body."""
        return self.snapshot()

    def replace_from_master(self, table: DelayOffsetTable) -> bool:
        """Slave sync (GET_ALL_DELAY_OFFSET): RocketMQ writes the master's body verbatim, i.e.
        takes its table. Returns whether anything changed."""
        if table.offset_table == self._table and table.data_version == self._version:
            return False
        self._table = dict(table.offset_table)
        self._version = table.data_version
        self._dirty = True
        return True

    def snapshot(self) -> DelayOffsetTable:
        return DelayOffsetTable(dict(self._table), self._version)

    @staticmethod
    def encode_snapshot(snapshot: DelayOffsetTable) -> bytes:
        return encode_delay_offsets(snapshot)
