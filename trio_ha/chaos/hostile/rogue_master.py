"""The attacker on a slave's HA client: ``RogueHAMaster``, a listener that plays master to a
slave pointed at it, each session run by a script (``start_at``: a first frame where no log
can begin; the fuzzer's ``master_frame_script``: mutated frame streams).

Why a module of its own: every other attacker dials the node; this one is dialled by it, and
a slave trusts its master with its bytes, so what it must refuse (a start no log can have, a
stream that is not frames) is a different defence from the master's (``replication``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import attrs
import trio

from ...wire.ha import FRAME_HEADER as FRAME
from ...wire.ha import REPORT
from ._common import (
    CONNECT_TIMEOUT,
    closed_by_node,
    node_has_closed,
    receive_exactly,
    send_until_closed,
)

__all__ = ["RogueHAMaster", "Script", "start_at"]

#: What a rogue master does with one session: it gets the connection and the session's
#: number (from 0); the slave's first report has not been read yet.
Script = Callable[[trio.SocketStream, int], Awaitable[None]]


def start_at(offset: int, size: int = 100) -> Script:
    """A script that answers the slave's first report with one data frame of ``size`` bytes
    at ``offset``, then waits for the slave to leave."""

    async def script(stream: trio.SocketStream, session: int) -> None:
        await receive_exactly(stream, REPORT.size, CONNECT_TIMEOUT)
        if await send_until_closed(stream, FRAME.pack(offset, size) + b"x" * size):
            await closed_by_node(stream, float("inf"))

    return script


@attrs.define(eq=False)
class RogueHAMaster:
    """A listener that plays master to the slaves that connect to it: each connection (a
    session) runs ``script``, which may be replaced between sessions. Counts the sessions
    and those the slave ended (closed while the script waited on it)."""

    script: Script
    sessions: int = 0
    ended_by_slave: int = 0
    address: str | None = None

    async def serve(self, *, listeners: list[trio.SocketListener] | None = None,
                    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve on ``listeners`` (by default a new one on 127.0.0.1, port 0) until
        cancelled; reports ``host:port``."""
        if listeners is None:
            listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        host, port = listeners[0].socket.getsockname()[:2]
        self.address = f"{host}:{port}"
        task_status.started(self.address)
        await trio.serve_listeners(self._session, listeners)

    async def _session(self, stream: trio.SocketStream) -> None:
        number = self.sessions
        self.sessions += 1
        async with stream:
            try:
                await self.script(stream, number)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self.ended_by_slave += 1
            else:
                if node_has_closed(stream):
                    self.ended_by_slave += 1
