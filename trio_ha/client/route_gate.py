"""When a client asks the name server for a topic's route again: one topic's back-off.

A send that fails on a broker that is no longer the master (its connection refused or
closed, or an answer such as a slave's SERVICE_NOT_AVAILABLE) is the first sign of a master
change. Waiting for the periodic poll (30 s, the Java client's ``pollNameServerInterval``)
would leave the producer failing, or writing to no one, for up to 30 s after the new master
registered; so a failure asks for the topic's route at once. But a failure storm (every
send of a busy producer failing against a dead master) must not become a lookup storm
against the name server, so lookups of one topic are spaced:

- the first lookup after a quiet spell goes out at once;
- the next may start ``minimum`` (100 ms) after the latest one started, and that spacing
  doubles with each further lookup in a row that finds the route unchanged (or gets no
  answer), up to ``maximum`` (1 s): lookups 100, 200, 400 and 800 ms apart, then one a second
  while the route stays the same;
- a lookup that finds the route changed, or a topic without a lookup for twice ``maximum``,
  starts the spacing again from ``minimum``.

(That, and the instance's one lookup at a time per topic, shared by every caller that waited
for it, is the whole bound; docs/remoting.md, *Our client*.) This module is the rule alone,
as plain state with the times passed in, as the name server's route table is; the client
instance keeps one per topic and runs it under trio.
"""

from __future__ import annotations

import math

import attrs

__all__ = ["RouteGate"]


@attrs.define
class RouteGate:
    """The lookups of one topic's route: when the next may start."""

    #: seconds between lookups after a change (``ClientConfig.route_refresh_min_interval``)
    minimum: float = 0.1
    #: the longest spacing while lookups find nothing new
    maximum: float = 1.0
    #: lookups in a row that found the route unchanged (or no answer)
    unchanged: int = 0
    #: when the latest lookup started (None: never)
    last_start: float | None = None
    #: lookups started so far: a caller that saw a number before it waited for the topic's
    #: lock, and finds a greater one after, shares the answer of a lookup newer than its ask
    started_count: int = 0

    @property
    def interval(self) -> float:
        """The spacing after the latest lookup."""
        doubled = self.minimum * 2 ** max(self.unchanged - 1, 0)
        return max(self.minimum, min(doubled, self.maximum))

    def opens_at(self) -> float:
        """The earliest time the next lookup may start (-inf: at once)."""
        if self.last_start is None:
            return -math.inf
        return self.last_start + self.interval

    def start(self, now: float) -> None:
        """A lookup starts at ``now`` (on demand once ``opens_at``, or the periodic poll at
        its own pace). After a quiet spell the spacing starts from the minimum again."""
        if self.last_start is not None and now - self.last_start >= 2 * self.maximum:
            self.unchanged = 0
        self.last_start = now
        self.started_count += 1

    def finish(self, *, changed: bool) -> None:
        """The lookup started last is over: it found the route ``changed``, or not (the same
        route, or no answer at all), which widens the spacing."""
        if changed:
            self.unchanged = 0
        elif self.interval < self.maximum:  # counted no further once it is the longest
            self.unchanged += 1
