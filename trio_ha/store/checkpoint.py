"""The checkpoint file: how far the store knew its data was durable.

Byte-compatible with RocketMQ's 4 KiB ``checkpoint`` (docs/formats.md, 'Checkpoint'):
physicMsgTimestamp at 0 (store time of the last flushed commitlog record), logicsMsgTimestamp
at 8 (of the last flushed consume-queue entry), indexMsgTimestamp at 16, and 5.x's
masterFlushedOffset at 24 and confirmPhyOffset at 32. Abnormal recovery starts from the
newest segment whose first record is older than ``min_timestamp``, so the fields only ever
move over data that is already flushed (RocketMQ issues #678/#495 came from advancing them
earlier).
"""

from __future__ import annotations

import os
import struct

import attrs

FILE_SIZE = 4096
_FIELDS = struct.Struct(">qqqqq")
#: RocketMQ keeps 3 s of slack below the recorded timestamps
SAFETY_MARGIN_MS = 3000


@attrs.define(eq=False)
class Checkpoint:
    path: str
    physic_msg_timestamp: int = 0
    logics_msg_timestamp: int = 0
    index_msg_timestamp: int = 0
    master_flushed_offset: int = 0
    confirm_phy_offset: int = 0

    @classmethod
    def load(cls, path: str) -> Checkpoint:
        checkpoint = cls(path)
        try:
            with open(path, "rb") as f:
                raw = f.read(_FIELDS.size)
        except FileNotFoundError:
            return checkpoint
        if len(raw) == _FIELDS.size:
            (
                checkpoint.physic_msg_timestamp, checkpoint.logics_msg_timestamp,
                checkpoint.index_msg_timestamp, checkpoint.master_flushed_offset,
                checkpoint.confirm_phy_offset,
            ) = _FIELDS.unpack(raw)
        return checkpoint

    @property
    def min_timestamp(self) -> int:
        low = min(self.physic_msg_timestamp, self.logics_msg_timestamp) - SAFETY_MARGIN_MS
        return max(0, low)

    def encode(self) -> bytes:
        fields = _FIELDS.pack(
            self.physic_msg_timestamp, self.logics_msg_timestamp, self.index_msg_timestamp,
            self.master_flushed_offset, self.confirm_phy_offset,
        )
        return fields + bytes(FILE_SIZE - len(fields))

    def write(self) -> None:
        """Write and fsync the file in place (blocking: call from a worker thread)."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, self.encode(), 0)
            os.fdatasync(fd)
        finally:
            os.close(fd)
