"""Log lines a hostile peer can cause, at a rate it cannot raise.

A bad frame, a refused connection or a failing request is one line in the log when it is the
first of its kind in ``interval`` seconds; the rest of that interval's are counted and the
count rides on the next line that gets through ("... (and 1999 more like it)"). A peer that
sends 2,000 bad requests costs two lines, not 2,000 tracebacks. The store uses it the same way
for troubles that last (a full disk, no descriptors left): one line when it starts, then at
most one per interval, and ``ended(kind)`` so that the next time it starts is logged at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable

import attrs

__all__ = ["RateLimitedLog"]

#: how many distinct kinds of line are remembered; a peer that invents kinds (request codes,
#: exception types) cannot grow the table without bound
MAX_KINDS = 1024


@attrs.define(eq=False)
class RateLimitedLog:
    logger: logging.Logger
    #: at most one line per kind in this many seconds
    interval: float = 10.0
    #: kind -> (time of the last line written, lines suppressed since)
    _kinds: dict[Hashable, tuple[float, int]] = attrs.field(factory=dict)

    def log(self, level: int, kind: Hashable, message: str, *args: object,
            exc_info: BaseException | None = None) -> bool:
        """Log ``message % args`` unless a line of this ``kind`` was logged within the
        interval (then count it); True when it was logged."""
        now = time.monotonic()
        last, suppressed = self._kinds.get(kind, (float("-inf"), 0))
        if now - last < self.interval:
            self._kinds[kind] = (last, suppressed + 1)
            return False
        if kind not in self._kinds and len(self._kinds) >= MAX_KINDS:
            self._forget_oldest()
        self._kinds[kind] = (now, 0)
        if suppressed:
            message += " (and %d more like it in the last %g s)"
            args = (*args, suppressed, self.interval)
        self.logger.log(level, message, *args, exc_info=exc_info)
        return True

    def ended(self, kind: Hashable) -> None:
        """The trouble of this ``kind`` is over: its next line is logged at once."""
        self._kinds.pop(kind, None)

    def _forget_oldest(self) -> None:
        oldest = min(self._kinds, key=lambda k: self._kinds[k][0])
        del self._kinds[oldest]
