"""Store health: running out of disk or descriptors is a state the store reports and leaves,
not an exception that ends it (docs/formats.md, 'Disk full and descriptors').

* **Disk use.** Every ``DISK_CHECK_INTERVAL`` the store looks at how full the filesystems of
  its commitlog and consume queues are. Above ``diskSpaceWarningLevelRatio`` (90 %, RocketMQ's
  default) it refuses puts with SERVICE_NOT_AVAILABLE, as RocketMQ marks its disk full, until
  use falls below it again (retention deletes expired files above diskMaxUsedSpaceRatio, 75 %,
  at any hour).
* **Allocation.** A commitlog segment the allocator cannot create (ENOSPC, EMFILE, ENOMEM) is
  retried every ``RETRY_INTERVAL``; meanwhile a put that needs a new segment gets
  CREATE_MAPEDFILE_FAILED at once, and puts that fit the current segment go on.
* **Consume queues.** An entry the dispatcher cannot write (a new file or its blocks) stops
  dispatch where it is, retried every ``RETRY_INTERVAL``; meanwhile puts get
  SERVICE_NOT_AVAILABLE (RocketMQ's "write to logic queue error") and consumers see what was
  indexed before.

Reads go on throughout. Each condition is logged when it starts (then at most once every
``LOG_INTERVAL`` while it lasts) and when it ends, and ``statistics().health`` shows it.
"""

from __future__ import annotations

import errno
import logging
import os

import attrs
import trio

from .._errors import TrioHAError
from ..ratelog import RateLimitedLog

__all__ = [
    "DiskMonitor", "DiskUsage", "StoreHealth", "StoreResourceError",
    "describe", "disk_used_ratio",
]

#: how often the disk use is looked at (a statvfs call per directory)
DISK_CHECK_INTERVAL = 1.0
#: how soon a failed segment creation or consume-queue write is tried again
RETRY_INTERVAL = 1.0
#: at most one log line per kind of trouble in this many seconds while it lasts
LOG_INTERVAL = 10.0

log = logging.getLogger(__name__)


class StoreResourceError(TrioHAError, OSError):
    """The store cannot open because it cannot write what it must before taking puts (the
    consume queues up to the recovered end of the commitlog): a full disk or no descriptors
    left. Free some and open it again."""


def disk_used_ratio(path: str) -> float:
    """How full the filesystem holding ``path`` is, for writers that are not root (0..1)."""
    st = os.statvfs(path)
    total = st.f_blocks * st.f_frsize
    if total <= 0:
        return 0.0
    available = st.f_bavail * st.f_frsize
    return 1.0 - available / total


def describe(exc: BaseException) -> str:
    """An OSError as one line: the errno's name and the message."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return f"{errno.errorcode.get(exc.errno, exc.errno)}: {exc}"
    return f"{type(exc).__name__}: {exc}"


@attrs.frozen
class DiskUsage:
    """How full the store's filesystems were at the last look (0..1)."""

    commitlog: float
    consume_queues: float


@attrs.define(eq=False)
class DiskMonitor:
    """Refuses puts (``full`` says why) while a filesystem of the store is fuller than
    diskSpaceWarningLevelRatio, and takes them again once it is not (RocketMQ marks its
    disk full and OK again the same way)."""

    #: the commitlog's and the consume queues' directories
    paths: tuple[str, str]
    #: diskSpaceWarningLevelRatio, a percentage
    limit: int
    full: str | None = None
    usage: DiskUsage = attrs.field(factory=lambda: DiskUsage(0.0, 0.0))
    _log: RateLimitedLog = attrs.field(factory=lambda: RateLimitedLog(log))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        task_status.started()
        while True:
            self.check()
            await trio.sleep(DISK_CHECK_INTERVAL)

    def check(self) -> None:
        """Look now (a statvfs per directory)."""
        commitlog, queues = self.paths
        try:
            usage = DiskUsage(disk_used_ratio(commitlog), disk_used_ratio(queues))
        except OSError as exc:
            self._log.log(logging.WARNING, "statvfs", "cannot read the disk use of %s: %s",
                          commitlog, describe(exc))
            return
        self.usage = usage
        fullest = max(usage.commitlog, usage.consume_queues)
        if fullest > self.limit / 100:
            if self.full is None:
                log.error("disk %.1f%% full (commitlog %s %.1f%%, consume queues %.1f%%), "
                          "above diskSpaceWarningLevelRatio %d%%: puts are refused until it "
                          "is not", fullest * 100, commitlog, usage.commitlog * 100,
                          usage.consume_queues * 100, self.limit)
            self.full = (f"the broker's disk is full ({fullest * 100:.1f}% used, above "
                         f"diskSpaceWarningLevelRatio {self.limit}%)")
        elif self.full is not None:
            log.warning("disk %.1f%% full (commitlog %s), below diskSpaceWarningLevelRatio "
                        "%d%%: puts are taken again", fullest * 100, commitlog, self.limit)
            self.full = None


@attrs.frozen
class StoreHealth:
    """What keeps the store from taking puts, if anything (None: nothing)."""

    #: the disk use (at the last look), and why puts are refused for it
    disk: DiskUsage
    disk_full: str | None
    #: why the next commitlog segment cannot be created, and how many attempts failed
    allocation_error: str | None
    allocation_failures: int
    #: why the consume queues cannot be written, and how many attempts failed
    dispatch_stalled: str | None
    dispatch_stalls: int
