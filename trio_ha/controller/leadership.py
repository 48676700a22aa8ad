"""Who leads the controllers: the one question the server asks before it decides.

RocketMQ's controllers are a Raft group: only the leader appends events, the others answer
CONTROLLER_NOT_LEADER (2007) to every request that goes through the log (1001-1004, 1006,
1011-1013) and answer GET_METADATA_INFO (1005) with the leader's address, which is how a
broker finds it. Our server asks a ``Leadership`` the same two things: am I the leader, and
who is. One controller alone is always the leader (``SoleLeadership``); several controllers
over etcd get theirs from an etcd election (a separate module), and the StateStore's
conditional commits keep a deposed leader that has not heard yet from granting anything.
"""

from __future__ import annotations

from typing import Protocol

import attrs

__all__ = ["Leadership", "SoleLeadership"]


class Leadership(Protocol):
    """A controller's view of who leads (read at each request: it may change any time)."""

    @property
    def is_leader(self) -> bool: ...

    @property
    def leader_address(self) -> str | None:
        """The leader's address for brokers (``host:port``), None while nobody leads."""
        ...

    @property
    def leader_id(self) -> str | None: ...


@attrs.define(eq=False)
class SoleLeadership:
    """One controller: always the leader, at its own address (set once it is bound)."""

    address: str | None = None
    self_id: str = "n0"

    @property
    def is_leader(self) -> bool:
        return True

    @property
    def leader_address(self) -> str | None:
        return self.address

    @property
    def leader_id(self) -> str | None:
        return self.self_id
