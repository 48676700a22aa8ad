"""The one base of every error this project raises, and exception plumbing shared by the async
context managers.

Why one base: an operator's tool must tell "something I can fix" (a port taken, a store in use,
a bad setting, a broker's refusal, a damaged file) from "a bug in trio_ha". Listing the expected
errors one by one at each place that reports them failed: every new error type escaped as a
200-line traceback until someone added it to the list. With one base, an error of ours is
expected by construction: the command line prints its message as one line and exits 1, and
only exceptions that are not ours (a bug) keep their traceback. Each error still derives from
the builtin that says what it is (ValueError, OSError, ...), so ``except OSError`` keeps
working. ``tests/test_cli_errors.py`` walks the package and fails on a class that forgets it.

This module imports nothing of ours, so every layer down to the sans-I/O codecs may use it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["TrioHAError", "unwrap_single_exception"]


class TrioHAError(Exception):
    """Base of every exception trio_ha defines. Its message is one line an operator can act
    on; code that catches it may show ``str(exc)`` alone, without a traceback."""


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
