"""Exception plumbing shared by the async context managers."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def unwrap_single_exception() -> Iterator[None]:
    """Let the one exception of a nursery's ExceptionGroup out as itself.

    Our context managers (``open_store``, ``open_remoting_client``, ...) run background tasks
    in a nursery and yield inside it, so an exception raised in the caller's ``async with``
    body would reach the caller wrapped in an ExceptionGroup — a RemotingError would slip
    past ``except RemotingError``. When the group holds exactly one exception, that one is
    what happened: re-raise it. Real multi-failure groups pass through unchanged."""
    try:
        yield
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            exc = group.exceptions[0]
            if isinstance(exc, BaseExceptionGroup):
                raise
            raise exc from group.__cause__
        raise
