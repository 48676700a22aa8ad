"""Our own controller (issue 39): RocketMQ 5's controller side of controller mode, so a broker
group fails over without a JVM. See docs/controller.md."""

from .journal import (
    CompactionFailed,
    CompactionInfo,
    Journal,
    JournalFailed,
    JournalLocked,
    JournalStatistics,
)
from .journal_format import JournalCorrupt
from .state_store import CommitConflict, StateStore, Versioned, Write

__all__ = [
    "CommitConflict", "CompactionFailed", "CompactionInfo", "Journal", "JournalCorrupt",
    "JournalFailed", "JournalLocked", "JournalStatistics", "StateStore", "Versioned", "Write",
]
