"""How long puts wait for a guarantee: a fixed-bucket histogram cheap enough for every put.

Operators ask "how long do SYNC_FLUSH puts wait for the disk, and SYNC_MASTER puts for a
slave?" as a distribution, not an average: a p99 that creeps towards syncFlushTimeout or
slaveTimeout is the warning before puts start failing. The sync request services
(``sync_requests``) answer every waiting put, so they observe each wait here as they answer
it.

This runs once per waiting put, on the event loop, so it is kept to the minimum: the bucket
bounds are fixed when the histogram is made, an observation is one ``bisect`` over them (C,
about four comparisons) plus an integer and a float addition, and nothing is allocated. The
counts are kept per bucket, not cumulative; ``snapshot`` copies them for a reader (the
broker's metrics endpoint turns them into a Prometheus histogram at scrape time). The store
knows nothing of Prometheus: the bounds are "le" bounds (a wait equal to a bound falls in that
bucket), and one more bucket past the last bound holds everything slower.
"""

from __future__ import annotations

import bisect

import attrs

__all__ = ["WAIT_BUCKETS", "WaitHistogram", "WaitHistogramSnapshot"]

#: upper bounds in seconds: from a tenth of a millisecond (a sync on a fast disk, a slave's
#: ack on loopback) to ten seconds (past the default syncFlushTimeout and slaveTimeout, 5 s
#: and 3 s, where waits end as timeouts)
WAIT_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
)


@attrs.frozen
class WaitHistogramSnapshot:
    """A copy of a histogram at one moment."""

    #: the buckets' upper bounds in seconds, ascending
    bounds: tuple[float, ...]
    #: waits per bucket, not cumulative: one more than ``bounds``, the last for waits
    #: longer than every bound
    counts: tuple[int, ...]
    #: the waits' sum, in seconds
    total_seconds: float

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, waits at or below it)`` per bucket, the last bound ``inf``: the
        shape of a Prometheus histogram's buckets."""
        out: list[tuple[float, int]] = []
        running = 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out


# on_setattr NO_OP: ``bounds``' converter would otherwise give the class a __setattr__ hook,
# and ``observe`` sets the total on every answered put (the hook was most of its cost).
@attrs.define(eq=False, on_setattr=attrs.setters.NO_OP)
class WaitHistogram:
    """Counts waits into fixed buckets (see the module's docstring)."""

    bounds: tuple[float, ...] = attrs.field(default=WAIT_BUCKETS, converter=tuple)
    _counts: list[int] = attrs.field(init=False)
    _total_seconds: float = attrs.field(init=False, default=0.0)

    def __attrs_post_init__(self) -> None:
        if list(self.bounds) != sorted(set(self.bounds)) or not self.bounds:
            raise ValueError(f"histogram bounds must ascend strictly: {self.bounds}")
        self._counts = [0] * (len(self.bounds) + 1)

    def observe(self, seconds: float) -> None:
        """Count one wait of ``seconds``."""
        self._counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self._total_seconds += seconds

    def snapshot(self) -> WaitHistogramSnapshot:
        return WaitHistogramSnapshot(self.bounds, tuple(self._counts), self._total_seconds)
